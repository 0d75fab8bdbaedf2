//! `herald accounts|groups|media|reminders|runs|users|audit|webhooks …`: the command-line client of the
//! control port. Tables for people, `--json` for scripts, and exit codes a
//! script can branch on (see [`Exit`]).
//!
//! Imports: `settings`, `token` and `export` only: the client knows the
//! daemon through its HTTP answers, never its types.

mod accounts;
mod conn;
mod format;
mod groups;
mod media;
mod people;
mod probe;
mod reminders;
mod runs;
mod sse;
mod webhooks;

pub use accounts::*;
pub use conn::*;
pub use format::*;
pub use groups::*;
pub use media::*;
pub use people::*;
pub use probe::*;
pub use reminders::*;
pub use runs::*;
pub use webhooks::*;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["id", "state"],
            vec![
                vec!["a1".into(), "connected".into()],
                vec!["long-id".into(), "x".into()],
            ],
        );
        assert_eq!(t, "ID       STATE\na1       connected\nlong-id  x\n");
    }

    #[test]
    fn a_targets_csv_gives_its_first_column() {
        let csv = "name,notes\nSales KL,weekly\n\n\"Team, East\",x\n120363000000000001@g.us\n\"Say \"\"hi\"\"\"\n";
        assert_eq!(
            csv_entries(csv).unwrap(),
            vec![
                "Sales KL",
                "Team, East",
                "120363000000000001@g.us",
                "Say \"hi\""
            ]
        );
        assert_eq!(csv_entries("Group 0001\n").unwrap(), vec!["Group 0001"]);
    }

    #[test]
    fn a_targets_csv_may_quote_line_breaks_and_start_with_a_bom() {
        // Excel's "CSV UTF-8": a byte-order mark before the header, CRLF
        // line ends, and a group name with a line break in it.
        let csv =
            "\u{feff}jid,notes\r\n\"Team\nEast\",\"two\r\nlines\"\r\n120363000000000001@g.us,x\r\n";
        assert_eq!(
            csv_entries(csv).unwrap(),
            vec!["Team\nEast", "120363000000000001@g.us"]
        );
    }

    #[test]
    fn toml_reminder_file_becomes_the_api_body() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.toml");
        std::fs::write(
            &path,
            "account_id = \"sales-1\"\ntitle = \"Standup\"\ntimezone = \"Asia/Kuala_Lumpur\"\ntargets = [\"120363000000000001@g.us\"]\n[schedule]\ncron = \"0 9 * * 1\"\n[[parts]]\nkind = \"text\"\ntext = \"hi\"\n",
        )
        .unwrap();
        let v = read_body_file(&path).unwrap();
        assert_eq!(v["schedule"]["cron"], "0 9 * * 1");
        assert_eq!(v["parts"][0]["kind"], "text");
        let parsed: herald_actors::domain::ReminderRequest = serde_json::from_value(v).unwrap();
        assert!(parsed.parse().is_ok());
    }

    #[test]
    fn csv_fields_are_quoted_only_when_they_must_be() {
        assert_eq!(csv_row(&["Team KL"]), "Team KL");
        assert_eq!(csv_row(&["KL, east"]), "\"KL, east\"");
        assert_eq!(csv_row(&["the \"A\" team"]), "\"the \"\"A\"\" team\"");
        assert_eq!(csv_row(&["a", "two\nlines", "c"]), "a,\"two\nlines\",c");
        let row = group_row(&json!({"jid": "1@g.us", "subject": "A", "participants": 3,
                                    "can_post": true, "labels": ["x", "y"]}));
        assert_eq!(row, vec!["1@g.us", "A", "3", "true", "x y"]);
    }

    #[test]
    fn url_encoding() {
        assert_eq!(url_encode("a b/é.png"), "a%20b%2F%C3%A9.png");
    }
}
