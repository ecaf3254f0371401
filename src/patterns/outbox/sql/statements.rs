//! The outbox's SQL text, per dialect: the lease (and PostgreSQL's delete-and-lease), the
//! deletes, failures, renewals and the backlog count. MySQL has no `UPDATE … RETURNING`: there
//! `pending` is the locking read of a lease (`FOR UPDATE SKIP LOCKED`), which
//! [`lease_ids`](Statements::lease_ids) then writes, in one transaction (`super::mysql`).

use std::borrow::Cow;
use std::time::Duration;

use crate::sql::{self, Dialect, Value};

/// Where `Statements::lease` writes the limit into SQLite's lease statement.
const LIMIT_MARK: &str = "%LIMIT%";

const COLUMNS: &str =
    "id, exchange, routing_key, body, content_type, headers, created_ms, attempts, last_error";

#[derive(Debug)]
pub(super) struct Statements {
    /// `… RETURNING id`, except on MySQL, where the id is `LAST_INSERT_ID()` after it.
    pub(super) add: String,
    /// On MySQL the locking read of the rows to lease (`$3` max attempts, `$4` limit).
    pub(super) pending: String,
    pub(super) delete: String,
    pub(super) failure: String,
    pub(super) retire: String,
    pub(super) retired: String,
    pub(super) release: String,
    pub(super) stats: String,
    /// PostgreSQL only (empty on SQLite and MySQL): see [`delete_and_lease_sql`].
    pub(super) delete_and_lease: String,
    pub(super) dialect: Dialect,
    pub(super) table: String,
}

impl Statements {
    pub(super) fn new(t: &str, dialect: Dialect) -> Statements {
        let p = |s: String| dialect.placeholders(&s);
        let lock = match dialect {
            Dialect::Postgres | Dialect::Mysql => " FOR UPDATE SKIP LOCKED",
            Dialect::Sqlite => "",
        };
        // Leases are written, and compared, with the database's clock.
        let now = dialect.now_ms_sql();
        // PostgreSQL: `id = ANY(ARRAY(…))` runs the locking subquery once, first, and finds
        // the rows it picked by the primary key. Written `id IN (SELECT …)`, the planner may
        // join it by hash against a sequential scan of the whole table (it does with a few
        // thousand rows pending), so each lease read every pending row.
        let (picked, end) = match dialect {
            Dialect::Postgres => ("= ANY(ARRAY(", "))"),
            Dialect::Sqlite | Dialect::Mysql => ("IN (", ")"),
        };
        // The limit: a parameter on PostgreSQL and MySQL, written in by `lease` on SQLite.
        let limit = match dialect {
            Dialect::Postgres | Dialect::Mysql => "$4",
            Dialect::Sqlite => LIMIT_MARK,
        };
        let returning = match dialect {
            Dialect::Mysql => "",
            Dialect::Sqlite | Dialect::Postgres => " RETURNING id",
        };
        // The rows a lease takes: not retired, not leased (or the lease ran out), in order.
        let leasable = format!(
            "FROM {t} WHERE attempts < $3 AND lease_until_ms <= {now} ORDER BY id LIMIT {limit}{lock}"
        );
        Statements {
            add: p(format!(
                "INSERT INTO {t} (exchange, routing_key, body, content_type, headers, \
                 created_ms, attempts, lease_until_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, 0, 0){returning}"
            )),
            // $1 owner, $2 lease in ms, $3 max attempts, $4 limit (see `lease`)
            pending: p(match dialect {
                Dialect::Mysql => format!("SELECT {COLUMNS} {leasable}"),
                Dialect::Sqlite | Dialect::Postgres => format!(
                    "UPDATE {t} SET lease_owner = $1, lease_until_ms = {now} + $2 WHERE id {picked}\
                     SELECT id {leasable}{end} \
                     AND attempts < $3 AND lease_until_ms <= {now} RETURNING {COLUMNS}"
                ),
            }),
            delete: p(format!("DELETE FROM {t} WHERE id = $1")),
            failure: p(format!(
                "UPDATE {t} SET attempts = attempts + 1, last_error = $2, \
                 lease_owner = NULL, lease_until_ms = 0 WHERE id = $1"
            )),
            retire: p(format!(
                "UPDATE {t} SET attempts = $3, last_error = $2, \
                 lease_owner = NULL, lease_until_ms = 0 WHERE id = $1"
            )),
            retired: p(format!(
                "SELECT {COLUMNS} FROM {t} WHERE attempts >= $1 ORDER BY id"
            )),
            release: p(format!(
                "UPDATE {t} SET attempts = 0, lease_owner = NULL, lease_until_ms = 0 \
                 WHERE id = $1"
            )),
            stats: p(format!(
                "SELECT COUNT(*), MIN(created_ms) FROM {t} WHERE attempts < $1"
            )),
            delete_and_lease: match dialect {
                Dialect::Postgres => delete_and_lease_sql(t),
                Dialect::Sqlite | Dialect::Mysql => String::new(),
            },
            dialect,
            table: t.to_owned(),
        }
    }

    /// The lease of up to `limit` records for `owner` (`pending`, and on SQLite the second
    /// statement of the delete-and-lease; on MySQL its locking read): the statement and its
    /// parameters — the owner, the lease, the attempts limit, and on PostgreSQL and MySQL the
    /// record limit.
    ///
    /// On SQLite the limit is written into the statement, not bound: SQLite's planner reads a
    /// bound `LIMIT`, so it marks the prepared statement stale whenever that parameter is
    /// bound again or cleared — and rusqlite clears a cached statement's parameters each time
    /// it goes back to the cache — after which SQLite compiles the whole statement anew at its
    /// next step: a re-prepare on every lease (~250,000 instructions, measured). A relay leases
    /// `batch_size` records each time, so its statement is one cached text. PostgreSQL
    /// statements are not cached (see [`crate::sql`]): there it stays parameter `$4`.
    pub(super) fn lease(
        &self,
        owner: &str,
        lease: Duration,
        max_attempts: u32,
        limit: usize,
    ) -> (Cow<'_, str>, Vec<Value>) {
        // At most `i64::MAX`: on SQLite a larger literal reads as a real number, which LIMIT
        // refuses.
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut params = vec![
            Value::Text(owner.to_owned()),
            Value::Integer(sql::duration_ms(lease)),
            Value::Integer(i64::from(max_attempts)),
        ];
        let sql = match self.dialect {
            Dialect::Postgres | Dialect::Mysql => {
                params.push(Value::Integer(limit));
                Cow::Borrowed(self.pending.as_str())
            }
            Dialect::Sqlite => Cow::Owned(self.pending.replacen(LIMIT_MARK, &limit.to_string(), 1)),
        };
        (sql, params)
    }

    /// `… WHERE id IN ($2, $3, …)` for `n` ids after `first` other parameters.
    fn ids_in(&self, first: usize, n: usize) -> String {
        (first + 1..=first + n)
            .map(|i| self.dialect.placeholder(i))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `id IN (…)` for `n` ids from parameter `first + 1` on: on PostgreSQL one array
    /// parameter (see [`id_list`]), so the statement is the same for every `n`; on SQLite and
    /// MySQL one parameter per id.
    fn id_is_one_of(&self, first: usize, n: usize) -> String {
        match self.dialect {
            Dialect::Postgres => format!("id = ANY(${}::bigint[])", first + 1),
            Dialect::Sqlite | Dialect::Mysql => format!("id IN ({})", self.ids_in(first, n)),
        }
    }

    /// MySQL: $1 owner, $2 lease in ms, the ids from $3: the lease of the rows the locking
    /// read (`pending`) picked.
    pub(super) fn lease_ids(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET lease_owner = $1, lease_until_ms = {} + $2 WHERE {}",
            self.table,
            self.dialect.now_ms_sql(),
            self.id_is_one_of(2, n)
        )
    }

    /// MySQL: $1 owner, the ids from $3 ($2 unused): the leases among them this owner still
    /// holds, locked (the renewal then extends them).
    pub(super) fn held_many(&self, n: usize) -> String {
        format!(
            "SELECT id FROM {} WHERE lease_owner = $1 AND lease_until_ms > {} AND {} FOR UPDATE",
            self.table,
            self.dialect.now_ms_sql(),
            self.id_is_one_of(2, n)
        )
    }

    pub(super) fn delete_many(&self, n: usize) -> String {
        format!(
            "DELETE FROM {} WHERE {}",
            self.table,
            self.id_is_one_of(0, n)
        )
    }

    /// $1 owner, $2 lease in ms, the ids from $3: the leases this owner still holds (not run
    /// out by the database's clock) extended by a whole lease from now (`RETURNING id`, but on
    /// MySQL, where [`held_many`](Self::held_many) reads them first).
    pub(super) fn renew_many(&self, n: usize) -> String {
        let now = self.dialect.now_ms_sql();
        let returning = match self.dialect {
            Dialect::Mysql => "",
            Dialect::Sqlite | Dialect::Postgres => " RETURNING id",
        };
        format!(
            "UPDATE {} SET lease_until_ms = {now} + {} \
             WHERE lease_owner = {} AND lease_until_ms > {now} AND {}{returning}",
            self.table,
            self.dialect.placeholder(2),
            self.dialect.placeholder(1),
            self.id_is_one_of(2, n)
        )
    }

    pub(super) fn unlease_many(&self, n: usize) -> String {
        format!(
            "UPDATE {} SET lease_owner = NULL, lease_until_ms = 0 \
             WHERE lease_owner = {} AND {}",
            self.table,
            self.dialect.placeholder(1),
            self.id_is_one_of(1, n)
        )
    }

    /// The parameters for [`id_is_one_of`](Self::id_is_one_of): one text array literal
    /// (`{1,2,3}`, cast to `bigint[]` by the statement) on PostgreSQL, one integer per id on
    /// SQLite and MySQL.
    pub(super) fn id_params(&self, ids: &[i64]) -> Vec<Value> {
        match self.dialect {
            Dialect::Postgres => vec![id_list(ids)],
            Dialect::Sqlite | Dialect::Mysql => ids.iter().map(|id| Value::Integer(*id)).collect(),
        }
    }
}

/// PostgreSQL: the delete of the published ids and the next lease in one statement (one
/// round trip, one commit). $1–$4 as `pending`, the ids in $5; the lease never picks an id
/// being deleted (a row whose lease ran out could otherwise be both deleted and leased by
/// the one statement).
fn delete_and_lease_sql(t: &str) -> String {
    let now = Dialect::Postgres.now_ms_sql();
    format!(
        "WITH gone AS (DELETE FROM {t} WHERE id = ANY($5::bigint[])) \
         UPDATE {t} SET lease_owner = $1, lease_until_ms = {now} + $2 WHERE id = ANY(ARRAY(\
         SELECT id FROM {t} WHERE attempts < $3 AND lease_until_ms <= {now} \
         AND id <> ALL($5::bigint[]) ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)) \
         AND attempts < $3 AND lease_until_ms <= {now} RETURNING {COLUMNS}"
    )
}

/// `ids` as PostgreSQL's text form of an array, `{1,2,3}`, sent as one parameter.
fn id_list(ids: &[i64]) -> Value {
    use std::fmt::Write;
    let mut s = String::with_capacity(ids.len() * 8 + 2);
    s.push('{');
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{id}");
    }
    s.push('}');
    Value::Text(s)
}
