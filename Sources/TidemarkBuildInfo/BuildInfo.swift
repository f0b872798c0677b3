/// What this binary was built from: the commit and the build date come from
/// `BuildInfo+Generated.swift`, which `Plugins/BuildInfoPlugin` writes before each build.
package enum BuildInfo {
    /// The Swift language version of the compiler that built it, as far as this source can tell.
    package static var swiftVersion: String {
        #if compiler(>=6.5)
        "6.5 or later"
        #elseif compiler(>=6.4)
        "6.4"
        #elseif compiler(>=6.3)
        "6.3"
        #elseif compiler(>=6.2)
        "6.2"
        #elseif compiler(>=6.1)
        "6.1"
        #else
        "6.0"
        #endif
    }
}
