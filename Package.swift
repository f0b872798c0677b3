// swift-tools-version: 6.0
import PackageDescription

let package = Package(
    name: "tidemark",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "tidemark", targets: ["tidemark"]),
        .library(name: "TidemarkCore", targets: ["TidemarkCore"]),
    ],
    dependencies: [
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    ],
    targets: [
        .target(
            name: "TidemarkCore",
            dependencies: [.product(name: "Yams", package: "Yams")]
        ),
        .target(
            name: "TidemarkEmulator",
            dependencies: ["TidemarkCore", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .target(
            name: "TidemarkStore",
            dependencies: ["TidemarkCore", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .executableTarget(
            name: "tidemark",
            dependencies: [
                "TidemarkCore", "TidemarkEmulator", "TidemarkStore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "tidemark-bench",
            dependencies: ["TidemarkCore", "TidemarkStore"],
            path: "Sources/tidemark-bench"
        ),
        .testTarget(name: "TidemarkCoreTests", dependencies: ["TidemarkCore"]),
        .testTarget(name: "TidemarkEmulatorTests", dependencies: ["TidemarkEmulator", "TidemarkCore"]),
        .testTarget(name: "TidemarkStoreTests", dependencies: ["TidemarkStore", "TidemarkCore"]),
        .testTarget(name: "TidemarkCLITests", dependencies: ["tidemark", "TidemarkCore", "TidemarkStore"]),
    ],
    swiftLanguageModes: [.v6]
)
