// swift-tools-version: 6.0
import PackageDescription

let package = Package(
    name: "tidemark",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "tidemark", targets: ["tidemark"]),
        .library(name: "TidemarkCore", targets: ["TidemarkCore"]),
        .library(name: "TidemarkRuntime", targets: ["TidemarkRuntime"]),
        // Conformance suites and twins for anyone adding a store or a source; no emulator inside.
        .library(name: "TidemarkTesting", targets: ["TidemarkTesting"]),
    ],
    dependencies: [
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.8.0"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
    ],
    targets: [
        // The system zlib (Debian's zlib1g-dev), for gzip inventories.
        .systemLibrary(name: "CZlib", path: "Sources/CZlib"),
        // Header-only C helpers (a prefetch hint for the large hash tables).
        .systemLibrary(name: "CShims", path: "Sources/CShims"),
        .target(
            name: "TidemarkCore",
            dependencies: [
                "CZlib", "CShims", .product(name: "Yams", package: "Yams"),
                .product(name: "Crypto", package: "swift-crypto"),
                // Graceful shutdown reaches the requests of an apply, not the journal that records them.
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .target(
            name: "TidemarkAuth",
            dependencies: [
                "TidemarkCore",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ]
        ),
        .target(
            name: "TidemarkEmulator",
            dependencies: [
                "TidemarkCore", "TidemarkAuth", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
            ]
        ),
        .target(
            name: "TidemarkFCM",
            dependencies: [
                "TidemarkCore", "TidemarkAuth",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        .target(
            name: "TidemarkStore",
            dependencies: [
                "TidemarkCore", .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The composition root every front end shares: settings resolved in one place, and the parts
        // (stores, sources, backends) built from them through registries.
        .target(
            name: "TidemarkRuntime",
            dependencies: [
                "TidemarkCore", "TidemarkEmulator", "TidemarkStore", "TidemarkFCM", "TidemarkAuth",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // `tidemark serve`: the reconcile loop as a service, its metrics, health endpoints and status.
        .target(
            name: "TidemarkServe",
            dependencies: [
                "TidemarkCore", "TidemarkRuntime", "TidemarkStore", "TidemarkFCM", "CShims",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The commit and build date `tidemark version` prints, written before each build by the plugin
        // (only the executable depends on it, so a new commit recompiles one small target).
        .target(name: "TidemarkBuildInfo", plugins: ["BuildInfoPlugin"]),
        .plugin(name: "BuildInfoPlugin", capability: .buildTool()),
        .executableTarget(
            name: "tidemark",
            dependencies: [
                "TidemarkCore", "TidemarkRuntime", "TidemarkEmulator", "TidemarkServe", "TidemarkBuildInfo",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "tidemark-bench",
            dependencies: ["TidemarkCore", "TidemarkStore"],
            path: "Sources/tidemark-bench"
        ),
        // Conformance suites, in-memory twins, a manual clock and fixtures, for every test target.
        .target(name: "TidemarkTesting", dependencies: ["TidemarkCore"]),
        // The backend suite, run against the emulator engine (so it needs the emulator).
        .target(name: "TidemarkBackendTesting", dependencies: ["TidemarkCore", "TidemarkEmulator", "TidemarkTesting"]),
        .testTarget(
            name: "TidemarkCoreTests",
            dependencies: [
                "TidemarkCore", "TidemarkTesting", "TidemarkBackendTesting", "TidemarkEmulator",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            exclude: ["Golden"]
        ),
        .testTarget(
            name: "TidemarkEmulatorTests",
            dependencies: ["TidemarkEmulator", "TidemarkCore", "TidemarkAuth", "TidemarkTesting"]
        ),
        .testTarget(
            name: "TidemarkFCMTests",
            dependencies: [
                "TidemarkFCM", "TidemarkEmulator", "TidemarkAuth", "TidemarkTesting", "TidemarkBackendTesting",
            ]
        ),
        .testTarget(
            name: "TidemarkRuntimeTests",
            dependencies: ["TidemarkRuntime", "TidemarkCore", "TidemarkStore", "TidemarkFCM", "TidemarkTesting"]
        ),
        .testTarget(
            name: "TidemarkServeTests",
            dependencies: [
                "TidemarkServe", "TidemarkRuntime", "TidemarkCore", "TidemarkTesting",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
            ],
            exclude: ["Golden"]
        ),
        .testTarget(name: "TidemarkStoreTests", dependencies: ["TidemarkStore", "TidemarkCore", "TidemarkTesting"]),
        .testTarget(
            name: "TidemarkCLITests",
            dependencies: [
                "tidemark", "TidemarkCore", "TidemarkStore", "TidemarkAuth", "TidemarkTesting",
                .product(name: "Yams", package: "Yams"), .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
