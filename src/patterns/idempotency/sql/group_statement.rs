//! The group commit's runner: a group's operations on one transaction, or on PostgreSQL a
//! group of claims and confirms as one statement; and each operation alone when a group fails.

use std::collections::{HashMap, HashSet};

use super::batch::claim_answer;
use super::statements::{claim_sql, confirm_sql};
use super::store::SqlIdempotencyStore;
use crate::error::Result;
use crate::patterns::idempotency::group_commit::{Done, Op, Runner};
use crate::patterns::idempotency::store::{Claim, ClaimToken};
use crate::sql::{self, Dialect, Sql, Value};

impl Runner for SqlIdempotencyStore {
    /// One group's operations on one transaction (see [`group_commit`](crate::patterns::idempotency::group_commit)): each one's answer, or
    /// the error that failed the transaction. On PostgreSQL a group of claims and confirms
    /// is one statement ([`group_statement`](Self::group_statement)).
    /// The group's claims are made under `token`.
    fn run_group(&self, ops: &[Op], token: &ClaimToken) -> Result<Vec<Done>> {
        let mut conn = (self.connect)()?;
        if conn.dialect() == Dialect::Postgres && one_statement_will_do(ops) {
            return self.group_statement(&mut *conn, ops, token);
        }
        sql::in_one_transaction(
            &mut *conn,
            "a group commit",
            |e, what| self.context(e, what),
            |tx| self.group_ops(tx, ops, token),
        )
    }

    /// One operation alone, on a connection of its own (a failed group's fallback). A claim
    /// is made under `own`, the failed group's token, when given: the group's statement may
    /// have committed before the group failed (on PostgreSQL it commits on its own, and a
    /// confirm's fallback after it can still fail), and then the key is already held by
    /// that token — the caller's own claim, not one in progress elsewhere.
    fn run_alone(&self, op: &Op, own: Option<&ClaimToken>) -> Result<Done> {
        let claim = match op {
            Op::Claim(key) => {
                let mut conn = (self.connect)()?;
                let token = own.cloned().unwrap_or_default();
                self.claim_as(&mut *conn, key, token)?
            }
            Op::Confirm(key, token) => {
                let mut conn = (self.connect)()?;
                self.confirm_on(&mut *conn, key, token)?;
                Claim::Duplicate
            }
            Op::Release(key, token) => {
                self.release_alone(key, token)?;
                Claim::InProgress
            }
        };
        Ok(Done { claim })
    }
}

impl SqlIdempotencyStore {
    fn group_ops(&self, conn: &mut dyn Sql, ops: &[Op], token: &ClaimToken) -> Result<Vec<Done>> {
        let claims: Vec<&str> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Claim(key) => Some(key.as_str()),
                _ => None,
            })
            .collect();
        // Distinct keys claimed together; a key asked for twice: the second is in progress.
        let mut distinct: Vec<&str> = Vec::new();
        for k in &claims {
            if !distinct.contains(k) {
                distinct.push(k);
            }
        }
        let answers = self.claim_many_in(conn, &distinct, token)?;
        let mut answer_of: HashMap<&str, Claim> = distinct.into_iter().zip(answers).collect();
        // Confirms, one statement for all of them (each holds the token of the group that
        // claimed it).
        let confirms: Vec<(&str, &ClaimToken)> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Confirm(key, token) => Some((key.as_str(), token)),
                _ => None,
            })
            .collect();
        self.confirm_pairs_in(conn, &confirms)?;
        let mut done = Vec::with_capacity(ops.len());
        for op in ops {
            done.push(Done {
                claim: match op {
                    Op::Claim(key) => answer_of
                        .insert(key.as_str(), Claim::InProgress)
                        .unwrap_or(Claim::InProgress),
                    Op::Confirm(..) => Claim::Duplicate,
                    Op::Release(key, token) => {
                        let s = self.statements(conn);
                        conn.execute(
                            &s.release,
                            &[
                                Value::Text(key.to_owned()),
                                Value::Text(token.as_str().to_owned()),
                            ],
                        )
                        .map_err(|e| self.context(e, "releasing a claim"))?;
                        Claim::InProgress
                    }
                },
            });
        }
        Ok(done)
    }

    /// A group of claims and confirms as **one statement** on PostgreSQL (its own
    /// transaction: atomic as the group's transaction is, in one round trip instead of
    /// five — `BEGIN`, the claims, the states of the keys not claimed, the confirms,
    /// `COMMIT`). Two data-modifying `WITH` parts: the claims (`INSERT … ON CONFLICT`, keys
    /// in order, as [`claim_many_in`](Self::claim_many_in) writes them) and the confirms
    /// (one `UPDATE` for every key and token), and the state the claimed keys had before
    /// the statement, which tells a receipt (duplicate) from a live claim (in progress).
    /// [`one_statement_will_do`] keeps out the groups it cannot run: a release, or a key
    /// both claimed and confirmed (PostgreSQL cannot modify one row twice in a statement).
    /// A confirm whose token no longer holds its key is then confirmed on its own, as
    /// `confirm_in` does.
    fn group_statement(
        &self,
        conn: &mut dyn Sql,
        ops: &[Op],
        token: &ClaimToken,
    ) -> Result<Vec<Done>> {
        let dialect = Dialect::Postgres;
        let t = &self.table;
        let mut claims: Vec<&str> = Vec::new();
        let mut confirms: Vec<(&str, &ClaimToken)> = Vec::new();
        for op in ops {
            match op {
                Op::Claim(key) if !claims.contains(&key.as_str()) => claims.push(key),
                Op::Confirm(key, token) => confirms.push((key, token)),
                _ => {}
            }
        }
        claims.sort_unstable();
        confirms.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut params = vec![
            Value::Integer(sql::duration_ms(self.claim_timeout)),
            Value::Text(token.as_str().to_owned()),
            Value::Integer(sql::duration_ms(self.retention)),
        ];
        let mut parts = Vec::new();
        let mut selects = Vec::new();
        if !claims.is_empty() {
            let first = params.len() + 1;
            params.extend(claims.iter().map(|k| Value::Text((*k).to_owned())));
            parts.push(format!(
                "claimed AS ({})",
                claim_sql(t, dialect, first, claims.len())
            ));
            selects.push("SELECT 'claimed', key FROM claimed".to_owned());
            selects.push(format!(
                "SELECT state, key FROM {t} WHERE key IN ({})",
                (first..first + claims.len())
                    .map(|i| format!("${i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !confirms.is_empty() {
            let first = params.len() + 1;
            for (key, token) in &confirms {
                params.push(Value::Text((*key).to_owned()));
                params.push(Value::Text(token.as_str().to_owned()));
            }
            parts.push(format!(
                "confirmed AS ({})",
                confirm_sql(t, dialect, 3, first, confirms.len())
            ));
            selects.push("SELECT 'confirmed', key FROM confirmed".to_owned());
        }
        let sql = format!("WITH {} {}", parts.join(", "), selects.join(" UNION ALL "));
        let mut claimed = HashSet::new();
        let mut confirmed = HashSet::new();
        let mut before = HashMap::new();
        for row in conn
            .query(&sql, &params)
            .map_err(|e| self.context(e, "a group commit"))?
        {
            let (what, key) = (sql::col_text(&row, 0)?, sql::col_text(&row, 1)?);
            match what.as_str() {
                "claimed" => {
                    claimed.insert(key);
                }
                "confirmed" => {
                    confirmed.insert(key);
                }
                _ => {
                    before.insert(key, what);
                }
            }
        }
        for (key, token) in &confirms {
            if !confirmed.contains(*key) {
                self.confirm_on(conn, key, token)?;
            }
        }
        let mut answered: HashSet<&str> = HashSet::new();
        Ok(ops
            .iter()
            .map(|op| Done {
                claim: match op {
                    // A key asked for twice in one group: the second is in progress.
                    Op::Claim(key) if !answered.insert(key.as_str()) => Claim::InProgress,
                    Op::Claim(key) => claim_answer(claimed.contains(key), before.get(key), token),
                    _ => Claim::Duplicate,
                },
            })
            .collect())
    }
}

/// Whether [`SqlIdempotencyStore::group_statement`] can run `ops`: claims and confirms
/// only, no key both claimed and confirmed.
fn one_statement_will_do(ops: &[Op]) -> bool {
    let mut claimed = Vec::new();
    let mut confirmed = Vec::new();
    for op in ops {
        match op {
            Op::Claim(key) => claimed.push(key.as_str()),
            Op::Confirm(key, _) => confirmed.push(key.as_str()),
            Op::Release(..) => return false,
        }
    }
    confirmed.iter().all(|k| !claimed.contains(k))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use parking_lot::Mutex;

    use super::*;
    use crate::error::Error;
    use crate::patterns::idempotency::sql::SqlIdempotencyStoreOptions;
    use crate::patterns::idempotency::store::IdempotencyStore;

    /// Waits up to 30 s for `done` (a hang fails the test), looking again every millisecond.
    fn wait_for(what: &str, done: &dyn Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not done after 30 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until `n` operations are queued for the store's next group.
    fn queued_in(store: &SqlIdempotencyStore, n: usize) {
        wait_for(&format!("{n} queued"), &|| {
            store.group.as_ref().is_some_and(|g| g.queued() == n)
        })
    }

    /// The first group's connection waits at a gate until two more callers are queued;
    /// the second group (those two) panics while opening its connection. The caller that
    /// led it panics; the other is answered with an error instead of waiting for ever; and
    /// the store goes on committing groups.
    #[cfg(feature = "sqlite")]
    #[test]
    fn a_group_that_panics_answers_its_other_caller_with_an_error_and_the_next_group_runs() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let path = std::env::temp_dir().join(format!(
            "acemq-group-panic-{}-{}.db",
            std::process::id(),
            ClaimToken::new().as_str()
        ));
        let gate = Arc::new((Mutex::new(false), parking_lot::Condvar::new()));
        let calls = Arc::new(AtomicUsize::new(0));
        let (g, c, file) = (gate.clone(), calls.clone(), path.clone());
        let store = Arc::new(
            SqlIdempotencyStore::open(
                move || {
                    match c.fetch_add(1, Ordering::SeqCst) {
                        // create_table
                        0 => {}
                        1 => {
                            let (open, opened) = &*g;
                            let mut open = open.lock();
                            let deadline = Instant::now() + Duration::from_secs(30);
                            while !*open {
                                if opened.wait_until(&mut open, deadline).timed_out() {
                                    panic!("the test never opened the gate");
                                }
                            }
                        }
                        2 => panic!("opening this group's connection panicked on purpose"),
                        _ => {}
                    }
                    rusqlite::Connection::open(&file).map_err(|e| Error::sql("opening", e))
                },
                SqlIdempotencyStoreOptions::default().group_commit(true),
            )
            .unwrap(),
        );
        store.create_table().unwrap();
        let queued = |n: usize| queued_in(&store, n);
        // Threads of their own, not scoped: a caller that is never answered must fail the
        // test, not hang it.
        let claim = |key: &'static str| {
            let store = store.clone();
            std::thread::spawn(move || store.claim(key))
        };
        let first = claim("a");
        // The first caller leads and waits at the gate with an empty queue.
        wait_for("the first group", &|| calls.load(Ordering::SeqCst) >= 2);
        let second = claim("b");
        queued(1);
        let third = claim("c");
        queued(2);
        *gate.0.lock() = true;
        gate.1.notify_all();
        wait_for("every caller's answer", &|| {
            first.is_finished() && second.is_finished() && third.is_finished()
        });
        assert!(matches!(first.join().unwrap(), Ok(Claim::Claimed(_))));
        // The second caller led the panicking group; the third was answered.
        assert!(second.join().is_err());
        let e = third.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        // Nothing of the panicked group was committed; the store goes on.
        assert!(matches!(store.claim("b"), Ok(Claim::Claimed(_))));
        assert!(matches!(store.claim("c"), Ok(Claim::Claimed(_))));
        assert_eq!(store.claim("a").unwrap(), Claim::InProgress);
        let _ = std::fs::remove_file(&path);
    }

    /// Issue 35 item 10, on PostgreSQL. One group holds a claim of `k1` and the confirm of
    /// a claim whose token no longer holds its key (taken over): the group statement
    /// commits the claim, then the confirm's fallback fails once (a trigger on the real
    /// table raises on the receipt it inserts, the first time only), so the group is run
    /// again op by op. The rerun must recognise the claim of `k1` as the group's own —
    /// `Claimed`, not `InProgress` (which would leave the message waiting out the lease).
    #[cfg(feature = "postgres")]
    #[test]
    fn a_group_rerun_after_its_statement_committed_recognises_its_own_claims() {
        use std::sync::atomic::{AtomicBool, Ordering};
        const URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";
        let pg = || {
            postgres::Client::connect(URL, postgres::NoTls)
                .map_err(|e| Error::sql("connecting to the test database", e))
        };
        let table = format!(
            "acemq_group_rerun_{}_{}",
            std::process::id(),
            ClaimToken::new().as_str().replace('-', "")
        );
        // The next connection opened waits at the gate while `armed`.
        let gate = Arc::new((Mutex::new(false), parking_lot::Condvar::new()));
        let armed = Arc::new(AtomicBool::new(false));
        let (g, a) = (gate.clone(), armed.clone());
        let store = Arc::new(
            SqlIdempotencyStore::open(
                move || {
                    if a.swap(false, Ordering::SeqCst) {
                        let (open, opened) = &*g;
                        let mut open = open.lock();
                        let deadline = Instant::now() + Duration::from_secs(30);
                        while !*open {
                            if opened.wait_until(&mut open, deadline).timed_out() {
                                panic!("the test never opened the gate");
                            }
                        }
                    }
                    pg()
                },
                SqlIdempotencyStoreOptions::default()
                    .table(table.clone())
                    .claim_timeout(Duration::from_secs(60))
                    .group_commit(true),
            )
            .unwrap(),
        );
        store.create_table().unwrap();
        let mut admin = pg().unwrap();
        // A receipt inserted fails the first time (a sequence is not rolled back).
        admin
            .batch_execute(&format!(
                "CREATE SEQUENCE {table}_fail; \
                 CREATE FUNCTION {table}_fail() RETURNS trigger AS $$ BEGIN \
                   IF NEW.state = 'CONFIRMED' AND nextval('{table}_fail') = 1 THEN \
                     RAISE EXCEPTION 'the confirm fallback fails once, on purpose'; \
                   END IF; RETURN NEW; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER {table}_fail BEFORE INSERT ON {table} \
                   FOR EACH ROW EXECUTE FUNCTION {table}_fail();"
            ))
            .unwrap();
        // A claim whose lease was taken over: its holder's token no longer holds the key.
        let stale = match store.claim("taken").unwrap() {
            Claim::Claimed(t) => t,
            other => panic!("a new key is claimed: {other:?}"),
        };
        admin
            .execute(
                &format!("UPDATE {table} SET token = 'successor' WHERE key = 'taken'"),
                &[],
            )
            .unwrap();
        let queued = |n: usize| queued_in(&store, n);
        // A first group waits at the gate while the confirm and the claim queue behind it:
        // they make the next group together.
        armed.store(true, Ordering::SeqCst);
        let first = {
            let store = store.clone();
            std::thread::spawn(move || store.claim("warm"))
        };
        wait_for("the first group", &|| !armed.load(Ordering::SeqCst));
        let confirm = {
            let (store, stale) = (store.clone(), stale.clone());
            std::thread::spawn(move || store.confirm("taken", &stale))
        };
        queued(1);
        let claim = {
            let store = store.clone();
            std::thread::spawn(move || store.claim("k1"))
        };
        queued(2);
        *gate.0.lock() = true;
        gate.1.notify_all();
        wait_for("every caller's answer", &|| {
            first.is_finished() && confirm.is_finished() && claim.is_finished()
        });
        assert!(first.join().unwrap().unwrap().is_claimed());
        confirm.join().unwrap().unwrap();
        let failed_once: i64 = admin
            .query_one(&format!("SELECT last_value FROM {table}_fail"), &[])
            .unwrap()
            .get(0);
        assert_eq!(
            failed_once, 2,
            "the fallback failed once, then the rerun confirmed"
        );
        let k1 = claim.join().unwrap().unwrap();
        let cleanup = |admin: &mut postgres::Client| {
            let _ = admin.batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_fail(); \
                 DROP SEQUENCE IF EXISTS {table}_fail;"
            ));
        };
        let Claim::Claimed(token) = k1 else {
            cleanup(&mut admin);
            panic!("the group's own committed claim of k1 was answered {k1:?}");
        };
        // The claim is the caller's, fenced by the token it was given.
        store.confirm("k1", &token).unwrap();
        assert_eq!(store.claim("k1").unwrap(), Claim::Duplicate);
        assert_eq!(store.claim("taken").unwrap(), Claim::Duplicate);
        cleanup(&mut admin);
    }

    #[test]
    fn a_group_with_a_release_or_a_key_claimed_and_confirmed_is_not_one_statement() {
        let t = ClaimToken::new();
        let claim = |k: &str| Op::Claim(k.into());
        let confirm = |k: &str| Op::Confirm(k.into(), t.clone());
        assert!(one_statement_will_do(&[
            claim("a"),
            confirm("b"),
            claim("a")
        ]));
        assert!(!one_statement_will_do(&[claim("a"), confirm("a")]));
        assert!(!one_statement_will_do(&[
            claim("a"),
            Op::Release("b".into(), t.clone())
        ]));
    }
}
