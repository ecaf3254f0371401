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
        let k = dialect.column("key");
        // $1 key, $2 the lease or retention in ms, then the statement's own. `taken` is the
        // condition under which an existing row is taken over, `None` for always.
        let upsert = |state: &str, token: &str, taken: Option<&str>| {
            let insert = format!(
                "INSERT INTO {t} ({k}, state, deadline_ms, token) \
                 VALUES ($1, '{state}', {now} + $2, {token})"
            );
            p(match (dialect, taken) {
                (Dialect::Mysql, None) => format!(
                    "{insert} ON DUPLICATE KEY UPDATE state = '{state}', \
                     deadline_ms = {now} + $2, token = {token}"
                ),
                // MySQL assigns left to right, each assignment seeing the ones before it: the
                // condition reads `deadline_ms`, so it is assigned last, and the token and state
                // written when the row is taken keep the condition true for what follows.
                (Dialect::Mysql, Some(c)) => format!(
                    "{insert} ON DUPLICATE KEY UPDATE token = IF({c}, {token}, token), \
                     state = IF({c}, '{state}', state), \
                     deadline_ms = IF({c}, {now} + $2, deadline_ms)"
                ),
                (Dialect::Sqlite | Dialect::Postgres, taken) => format!(
                    "{insert} ON CONFLICT ({k}) DO UPDATE SET state = excluded.state, \
                     deadline_ms = excluded.deadline_ms, token = excluded.token{}",
                    taken.map(|c| format!(" WHERE {c}")).unwrap_or_default()
                ),
            })
        };
        // On SQLite and PostgreSQL the conditions read the existing row as `{t}.column`; on
        // MySQL, in `ON DUPLICATE KEY UPDATE`, a bare column is the existing row's.
        let row = match dialect {
            Dialect::Mysql => String::new(),
            Dialect::Sqlite | Dialect::Postgres => format!("{t}."),
        };
        let expired = format!("{row}deadline_ms <= {now}");
        // A claim also takes a key its own token holds: a group commit run again op by op
        // after its statement committed finds its own claims (fenced by the token).
        let expired_or_own = format!("{expired} OR ({row}state = '{CLAIMED}' AND {row}token = $3)");
        // MySQL: the read that follows a claim locks the row (the claim's upsert already holds
        // it), so that inside an older transaction it sees the row as it is, not as it was.
        let locking = match dialect {
            Dialect::Mysql => " FOR UPDATE",
            Dialect::Sqlite | Dialect::Postgres => "",
        };
        Statements {
            // $3 the claim's token
            claim: upsert(CLAIMED, "$3", Some(&expired_or_own)),
            first_time: upsert(CONFIRMED, "NULL", Some(&expired)),
            confirm: upsert(CONFIRMED, "NULL", None),
            // The holder's confirm, fenced by its token ($3). When it changes nothing (the
            // claim was taken over, or expired and was purged) the upsert records the
            // receipt all the same: the work is done.
            confirm_claimed: p(format!(
                "UPDATE {t} SET state = '{CONFIRMED}', deadline_ms = {now} + $2, \
                 token = NULL WHERE {k} = $1 AND state = '{CLAIMED}' AND token = $3"
            )),
            state: p(format!(
                "SELECT state, token FROM {t} WHERE {k} = $1{locking}"
            )),
            // Fenced: only the holder's own claim, never a receipt.
            release: p(format!(
                "DELETE FROM {t} WHERE {k} = $1 AND state = '{CLAIMED}' AND token = $2"
            )),
            forget: p(format!("DELETE FROM {t} WHERE {k} = $1")),
            purge: format!("DELETE FROM {t} WHERE deadline_ms <= {now}"),
        }
    }
}

/// The statement on table `t` claiming `n` keys, numbered from `$first`; `$1` is the lease in
/// milliseconds, `$2` the token. A key is taken when it is new or its deadline (a lease or a
/// receipt's retention) has passed. On SQLite and PostgreSQL `INSERT … ON CONFLICT … RETURNING
/// key`; on MySQL `INSERT … ON DUPLICATE KEY UPDATE`, which returns nothing: the keys held by
/// the token afterwards are the ones taken ([`select_keys_sql`]).
pub(super) fn claim_sql(t: &str, dialect: Dialect, first: usize, n: usize) -> String {
    let now = dialect.now_ms_sql();
    let k = dialect.column("key");
    let rows: Vec<String> = (first..first + n)
        .map(|i| format!("(${i}, '{CLAIMED}', {now} + $1, $2)"))
        .collect();
    let insert = format!(
        "INSERT INTO {t} ({k}, state, deadline_ms, token) VALUES {}",
        rows.join(", ")
    );
    match dialect {
        Dialect::Mysql => {
            let c = format!("deadline_ms <= {now}");
            format!(
                "{insert} ON DUPLICATE KEY UPDATE token = IF({c}, $2, token), \
                 state = IF({c}, '{CLAIMED}', state), deadline_ms = IF({c}, {now} + $1, deadline_ms)"
            )
        }
        Dialect::Sqlite | Dialect::Postgres => format!(
            "{insert} ON CONFLICT ({k}) DO UPDATE SET state = excluded.state, \
             deadline_ms = excluded.deadline_ms, token = excluded.token \
             WHERE {t}.deadline_ms <= {now} RETURNING {k}"
        ),
    }
}

/// `SELECT key, state, token … WHERE key IN ($first, …)` for `n` keys; on MySQL a locking
/// read (`FOR UPDATE`), which sees the rows as they are even inside an older transaction.
pub(super) fn select_keys_sql(t: &str, dialect: Dialect, first: usize, n: usize) -> String {
    let k = dialect.column("key");
    let keys: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    let locking = match dialect {
        Dialect::Mysql => " FOR UPDATE",
        Dialect::Sqlite | Dialect::Postgres => "",
    };
    format!(
        "SELECT {k}, state, token FROM {t} WHERE {k} IN ({}){locking}",
        keys.join(", ")
    )
}

/// `UPDATE … RETURNING key` on table `t` confirming `n` (key, token) pairs, numbered from `$first`
/// (key, then token); `$retention` is the receipt's retention in milliseconds. `key IN`
/// as well as the pairs: SQLite finds rows by the key's index only from a plain `IN`
/// list (for `(key, token) IN` alone it scans the table). On MySQL without `RETURNING`: the
/// pairs held are read (and locked) first ([`select_keys_sql`]).
pub(super) fn confirm_sql(
    t: &str,
    dialect: Dialect,
    retention: usize,
    first: usize,
    n: usize,
) -> String {
    let k = dialect.column("key");
    let keys: Vec<String> = (0..n).map(|i| format!("${}", first + 2 * i)).collect();
    let pairs: Vec<String> = (0..n)
        .map(|i| format!("(${}, ${})", first + 2 * i, first + 2 * i + 1))
        .collect();
    let returning = match dialect {
        Dialect::Mysql => String::new(),
        Dialect::Sqlite | Dialect::Postgres => format!(" RETURNING {k}"),
    };
    format!(
        "UPDATE {t} SET state = '{CONFIRMED}', deadline_ms = {now} + ${retention}, \
         token = NULL WHERE state = '{CLAIMED}' AND {k} IN ({}) AND ({k}, token) IN ({}){returning}",
        keys.join(", "),
        pairs.join(", "),
        now = dialect.now_ms_sql(),
    )
}
