//! The SQL store's statements: the text of each, per dialect.

use crate::sql::Dialect;

pub(super) const CLAIMED: &str = "CLAIMED";
pub(super) const CONFIRMED: &str = "CONFIRMED";

/// The store's statements in one dialect.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) claim: String,
    pub(super) first_time: String,
    pub(super) confirm: String,
    pub(super) confirm_claimed: String,
    pub(super) state: String,
    pub(super) release: String,
    pub(super) forget: String,
    pub(super) purge: String,
}

impl Statements {
    pub(super) fn new(t: &str, dialect: Dialect) -> Statements {
        let p = |s: String| dialect.placeholders(&s);
        // Every deadline is written, and compared, with the database's clock.
        let now = dialect.now_ms_sql();
        // $1 key, $2 the lease or retention in ms, then the statement's own.
        let upsert = |state: &str, token: &str, condition: &str| {
            p(format!(
                "INSERT INTO {t} (key, state, deadline_ms, token) \
                 VALUES ($1, '{state}', {now} + $2, {token}) \
                 ON CONFLICT (key) DO UPDATE SET state = excluded.state, \
                 deadline_ms = excluded.deadline_ms, token = excluded.token{condition}"
            ))
        };
        let expired = format!(" WHERE {t}.deadline_ms <= {now}");
        // A claim also takes a key its own token holds: a group commit run again op by op
        // after its statement committed finds its own claims (fenced by the token).
        let expired_or_own =
            format!("{expired} OR ({t}.state = '{CLAIMED}' AND {t}.token = excluded.token)");
        Statements {
            // $3 the claim's token
            claim: upsert(CLAIMED, "$3", &expired_or_own),
            first_time: upsert(CONFIRMED, "NULL", &expired),
            confirm: upsert(CONFIRMED, "NULL", ""),
            // The holder's confirm, fenced by its token ($3). When it changes nothing (the
            // claim was taken over, or expired and was purged) the upsert records the
            // receipt all the same: the work is done.
            confirm_claimed: p(format!(
                "UPDATE {t} SET state = '{CONFIRMED}', deadline_ms = {now} + $2, \
                 token = NULL WHERE key = $1 AND state = '{CLAIMED}' AND token = $3"
            )),
            state: p(format!("SELECT state FROM {t} WHERE key = $1")),
            // Fenced: only the holder's own claim, never a receipt.
            release: p(format!(
                "DELETE FROM {t} WHERE key = $1 AND state = '{CLAIMED}' AND token = $2"
            )),
            forget: p(format!("DELETE FROM {t} WHERE key = $1")),
            purge: format!("DELETE FROM {t} WHERE deadline_ms <= {now}"),
        }
    }
}

/// `INSERT … ON CONFLICT … RETURNING key` on table `t` claiming `n` keys, numbered from `$first`;
/// `$1` is the lease in milliseconds, `$2` the token. A key is taken when it is new or
/// its deadline (a lease or a receipt's retention) has passed.
pub(super) fn claim_sql(t: &str, dialect: Dialect, first: usize, n: usize) -> String {
    let now = dialect.now_ms_sql();
    let rows: Vec<String> = (first..first + n)
        .map(|i| format!("(${i}, '{CLAIMED}', {now} + $1, $2)"))
        .collect();
    format!(
        "INSERT INTO {t} (key, state, deadline_ms, token) VALUES {} \
         ON CONFLICT (key) DO UPDATE SET state = excluded.state, \
         deadline_ms = excluded.deadline_ms, token = excluded.token \
         WHERE {t}.deadline_ms <= {now} RETURNING key",
        rows.join(", ")
    )
}

/// `UPDATE … RETURNING key` on table `t` confirming `n` (key, token) pairs, numbered from `$first`
/// (key, then token); `$retention` is the receipt's retention in milliseconds. `key IN`
/// as well as the pairs: SQLite finds rows by the key's index only from a plain `IN`
/// list (for `(key, token) IN` alone it scans the table).
pub(super) fn confirm_sql(
    t: &str,
    dialect: Dialect,
    retention: usize,
    first: usize,
    n: usize,
) -> String {
    let keys: Vec<String> = (0..n).map(|i| format!("${}", first + 2 * i)).collect();
    let pairs: Vec<String> = (0..n)
        .map(|i| format!("(${}, ${})", first + 2 * i, first + 2 * i + 1))
        .collect();
    format!(
        "UPDATE {t} SET state = '{CONFIRMED}', deadline_ms = {now} + ${retention}, \
         token = NULL WHERE state = '{CLAIMED}' AND key IN ({}) AND (key, token) IN ({}) \
         RETURNING key",
        keys.join(", "),
        pairs.join(", "),
        now = dialect.now_ms_sql(),
    )
}
