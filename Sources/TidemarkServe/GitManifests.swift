import Foundation
import TidemarkCore
import TidemarkStore

/// Manifests that `serve` fetches itself from a git repository (`source: {git, branch, path}`): before
/// each reconcile it fetches the branch's newest commit with the `git` program and checks the
/// manifests directory of that commit out into `.tidemark/git/WORKSPACE/` of the project (or of
/// `TIDEMARK_CACHE_DIR`, `Runtime.cacheDirectory`), one directory per commit. The reconcile reads
/// that directory and names the commit.
///
/// Only the branch named is fetched (shallow, no tags), so only what was merged into it is ever
/// applied; pull requests keep using `tidemark plan` in CI. git runs with the process's environment
/// (SSH keys, credential helpers, `GIT_SSH_COMMAND`) and never prompts.
public struct GitManifests: Sendable {
    /// Where the manifests come from.
    public var source: ServeSection.GitSource
    /// The workspace's cache: `PROJECT/.tidemark/git/WORKSPACE`, or `$TIDEMARK_CACHE_DIR/git/WORKSPACE`.
    public var cache: String
    /// How long one git command may run, in seconds.
    public var timeout: Double = 120

    /// Fetches `source` into `cache`.
    public init(source: ServeSection.GitSource, cache: String) {
        self.source = source
        self.cache = cache
    }

    /// The cache of `workspace` in the project at `root`.
    public static func cache(root: String, workspace: String) -> String {
        cache(in: URL(fileURLWithPath: root).appendingPathComponent(".tidemark").path, workspace: workspace)
    }

    /// The cache of `workspace` under tidemark's own directory `directory` (`Runtime.cacheDirectory`).
    public static func cache(in directory: String, workspace: String) -> String {
        URL(fileURLWithPath: directory).appendingPathComponent("git/\(workspace)").path
    }

    /// What a fetch found: the commit and the directory holding its manifests.
    public struct Fetched: Sendable, Equatable {
        /// The commit the branch points at (40 hex digits).
        public var commit: String
        /// The manifests directory of that commit, checked out (absolute).
        public var directory: String
    }

    /// How the manifests are named in statuses: `git URL BRANCH:PATH` (no secret of the URL).
    public var display: String { "git \(source.displayURL) \(source.branch):\(source.path)" }

    /// Fetches the branch and checks its newest commit's manifests out (once per commit); removes the
    /// checkouts of older commits. Throws `GitSourceError` naming the repository, branch and cause.
    public func fetch() async throws -> Fetched {
        let repository = URL(fileURLWithPath: cache).appendingPathComponent("repo.git").path
        let checkouts = URL(fileURLWithPath: cache).appendingPathComponent("checkouts").path
        let files = FileManager.default
        try? files.createDirectory(atPath: checkouts, withIntermediateDirectories: true)
        if !files.fileExists(atPath: repository + "/HEAD") {
            try? files.removeItem(atPath: repository)
            _ = try await git(["init", "--quiet", "--bare", repository], "prepare the cache \(cache)")
        }
        removeStaleLocks(in: repository)
        let ref = "refs/tidemark/\(source.branch)"
        _ = try await git(
            [
                "--git-dir", repository, "fetch", "--quiet", "--depth", "1", "--no-tags", "--force", "--",
                source.url, "+refs/heads/\(source.branch):\(ref)",
            ], "fetch branch '\(source.branch)'")
        let commit = try await git(
            ["--git-dir", repository, "rev-parse", "--verify", "--quiet", "\(ref)^{commit}"],
            "read the commit of branch '\(source.branch)'"
        ).trimmingCharacters(in: .whitespacesAndNewlines)
        guard commit.count == 40, commit.allSatisfy(\.isHexDigit) else {
            throw GitSourceError(source: source, "git named no commit for branch '\(source.branch)' ('\(commit)')")
        }
        let checkout = URL(fileURLWithPath: checkouts).appendingPathComponent(commit).path
        if !files.fileExists(atPath: checkout) {
            let partial = URL(fileURLWithPath: checkouts).appendingPathComponent(".partial-\(UUID().uuidString)").path
            try files.createDirectory(atPath: partial, withIntermediateDirectories: true)
            defer { try? files.removeItem(atPath: partial) }
            // Its own index file: a checkout killed half-way leaves no lock behind for the next one.
            let index = partial + ".index"
            defer { try? files.removeItem(atPath: index) }
            do {
                _ = try await git(
                    [
                        "GIT_INDEX_FILE=\(index)", "git", "--git-dir", repository, "--work-tree", partial, "checkout",
                        "--quiet", "--force", commit, "--", source.path,
                    ], "check out '\(source.path)' of commit \(commit.prefix(12))", program: false)
            } catch let error as GitSourceError where error.detail.contains("did not match any file") {
                throw GitSourceError(
                    source: source,
                    "commit \(commit.prefix(12)) of branch '\(source.branch)' has no directory '\(source.path)'; check 'path' in \(source.location)"
                )
            }
            try files.moveItem(atPath: partial, toPath: checkout)
        }
        for old in (try? files.contentsOfDirectory(atPath: checkouts)) ?? [] where old != commit {
            try? files.removeItem(atPath: URL(fileURLWithPath: checkouts).appendingPathComponent(old).path)
        }
        let directory =
            source.path == "." ? checkout : URL(fileURLWithPath: checkout).appendingPathComponent(source.path).path
        var isDirectory: ObjCBool = false
        guard files.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw GitSourceError(
                source: source,
                "'\(source.path)' at commit \(commit.prefix(12)) of branch '\(source.branch)' is a file, not a directory of manifests; check 'path' in \(source.location)"
            )
        }
        return Fetched(commit: commit, directory: directory)
    }

    /// Lock files a git killed half-way left (only the replica that owns the workspace fetches into its
    /// cache, so a lock older than a git command may run is nobody's).
    private func removeStaleLocks(in repository: String) {
        let files = FileManager.default
        guard let walk = files.enumerator(atPath: repository) else { return }
        let limit = Date().addingTimeInterval(-(timeout + 60))
        for case let path as String in walk where path.hasSuffix(".lock") {
            let full = repository + "/" + path
            if let modified = (try? files.attributesOfItem(atPath: full))?[.modificationDate] as? Date, modified < limit
            {
                try? files.removeItem(atPath: full)
            }
        }
    }

    /// Runs git (`program`: the arguments follow `git`; else they are the whole command, for an
    /// environment variable before it), never prompting; its stdout, or a `GitSourceError` saying
    /// what it was doing, with git's own words and no secret of the URL.
    private func git(_ arguments: [String], _ doing: String, program: Bool = true) async throws -> String {
        let command = ["GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=true"] + (program ? ["git"] : []) + arguments
        let result: ProcessRunner.Result
        do {
            result = try await ProcessRunner(command: command, timeout: timeout, maxOutput: 1 << 20).run()
        } catch {
            throw GitSourceError(source: source, "could not \(doing): \(redacted("\(error)"))")
        }
        if result.status == 127, result.stderr.contains("git") {
            throw GitSourceError(
                source: source,
                "the git program is not installed; 'source: {git: …}' fetches with it (Debian: apt-get install git)")
        }
        guard result.status == 0 else {
            let said = redacted(result.stderr.trimmingCharacters(in: .whitespacesAndNewlines))
            throw GitSourceError(
                source: source,
                "could not \(doing) (git exited \(result.status)): \(said.isEmpty ? "no message" : said)"
            )
        }
        return String(decoding: result.stdout, as: UTF8.self)
    }

    private func redacted(_ text: String) -> String {
        text.replacingOccurrences(of: source.url, with: source.displayURL)
    }
}

/// Why manifests could not be fetched from git; the workspace's reconcile fails with reason
/// `source_unavailable`, and the next one tries again.
public struct GitSourceError: TidemarkError {
    /// Where the manifests come from.
    public var source: ServeSection.GitSource
    /// What went wrong.
    public var detail: String

    init(source: ServeSection.GitSource, _ detail: String) {
        self.source = source
        self.detail = detail
    }

    /// `source_unavailable`.
    public var reason: FailureReason { "source_unavailable" }

    /// The repository and branch, and what went wrong.
    public var description: String {
        "error: manifests from git \(source.displayURL) (branch '\(source.branch)', \(source.location)): \(detail)"
    }
}
