import TidemarkCore

/// The SQL that makes a table tell tidemark which devices changed: a trigger function and triggers
/// that `NOTIFY` a source's `listen` channel with the device id of every row inserted, updated (the
/// old id too when it changed) or deleted, and with an empty payload on `TRUNCATE` (every device is
/// read again). A team installs it as it is printed; tidemark never runs it.
public enum PostgresChangeTriggers {
    /// What is wrong with the arguments.
    public struct Problem: TidemarkError {
        /// `bad_argument`.
        public var reason: FailureReason { "bad_argument" }
        /// What to pass instead.
        public var description: String
    }

    /// The script for `table` (optionally `schema.table`) whose `idColumn` holds the device id,
    /// notifying `channel`; `source` names the inventory source in its comment.
    public static func sql(source: String, channel: String, table: String, idColumn: String) throws -> String {
        if let problem = PostgresSourceSettings.channelProblem(channel) {
            throw Problem(description: "the channel \(problem)")
        }
        let parts = table.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard (1...2).contains(parts.count), parts.allSatisfy(PostgresSourceSettings.isPlainName) else {
            throw Problem(
                description:
                    "--table must be a table name, or schema.table, of letters, digits and '_' (such as fcm_tokens or app.fcm_tokens), not '\(table)'."
            )
        }
        guard PostgresSourceSettings.isPlainName(idColumn) else {
            throw Problem(
                description:
                    "--id-column must be the column holding the device id, of letters, digits and '_' (such as device_id), not '\(idColumn)'."
            )
        }
        let function = String("tidemark_notify_\(channel)".prefix(63))
        let qualified = parts.count == 2 ? "\(parts[0]).\(function)" : function
        let rowTrigger = String("\(function)_row".prefix(63))
        let truncateTrigger = String("\(function)_truncate".prefix(63))
        return """
            -- tidemark: tell the inventory source '\(source)' which devices of \(table) changed.
            -- Every insert, update and delete notifies the channel '\(channel)' with the device id
            -- (\(idColumn)); a truncate notifies it with an empty payload, and tidemark reads every device.
            -- Install once, as the table's owner, for example: psql "$URL" -v ON_ERROR_STOP=1 -f triggers.sql
            -- Running it again replaces the function and the triggers.
            BEGIN;
            SET LOCAL client_min_messages = warning;

            CREATE OR REPLACE FUNCTION \(qualified)() RETURNS trigger
            LANGUAGE plpgsql AS $tidemark$
            BEGIN
              IF TG_OP = 'TRUNCATE' THEN
                PERFORM pg_notify('\(channel)', '');
              ELSIF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('\(channel)', OLD.\(idColumn)::text);
              ELSE
                PERFORM pg_notify('\(channel)', NEW.\(idColumn)::text);
                IF TG_OP = 'UPDATE' AND OLD.\(idColumn) IS DISTINCT FROM NEW.\(idColumn) THEN
                  PERFORM pg_notify('\(channel)', OLD.\(idColumn)::text);
                END IF;
              END IF;
              RETURN NULL;
            END
            $tidemark$;

            DROP TRIGGER IF EXISTS \(rowTrigger) ON \(table);
            CREATE TRIGGER \(rowTrigger)
              AFTER INSERT OR UPDATE OR DELETE ON \(table)
              FOR EACH ROW EXECUTE FUNCTION \(qualified)();

            DROP TRIGGER IF EXISTS \(truncateTrigger) ON \(table);
            CREATE TRIGGER \(truncateTrigger)
              AFTER TRUNCATE ON \(table)
              FOR EACH STATEMENT EXECUTE FUNCTION \(qualified)();

            COMMIT;

            """
    }
}
