import ArgumentParser
import TidemarkRuntime

/// `tidemark inventory …`: what the inventory sources of tidemark.yaml need from the app's database.
struct InventoryCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "inventory",
        abstract: "What the inventory sources of tidemark.yaml need from the app's database.",
        subcommands: [InventoryTriggersCommand.self]
    )
}

struct InventoryTriggersCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "triggers",
        abstract: "Print the SQL that makes a table notify a PostgreSQL source's 'listen' channel of changed devices.",
        discussion: """
            SOURCE is the name of a PostgreSQL inventory source in tidemark.yaml that has 'listen: CHANNEL'. \
            The printed script creates a trigger function and triggers on TABLE that NOTIFY the channel \
            with the device id (--id-column) of every row inserted, updated (the old id too when it \
            changes) or deleted, hard deletes included, and with an empty payload on \
            TRUNCATE, after which every device is read again. Install it as it is, once, as the table's \
            owner (psql "$URL" -v ON_ERROR_STOP=1 -f triggers.sql); running it again replaces what it \
            made. Reads tidemark.yaml only: tidemark connects to no database and runs nothing.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: "The name of the inventory source in tidemark.yaml (its 'name:').")
    var source: String

    @Option(help: "The table the source's query reads devices from (schema.table allowed).")
    var table: String

    @Option(name: .customLong("id-column"), help: "The column of TABLE that holds the device id.")
    var idColumn: String

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            try Terminal.write(try runtime.changeTriggers(source: source, table: table, idColumn: idColumn))
        }
    }
}
