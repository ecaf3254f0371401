//! The batch helpers: many keys claimed, confirmed or released in one statement (the
//! transactional wrappers' batches and the group commit's claims and confirms).

use std::collections::{HashMap, HashSet};

use super::statements::{claim_sql, confirm_sql, select_keys_sql, CLAIMED, CONFIRMED};
use super::store::SqlIdempotencyStore;
use crate::error::Result;
use crate::patterns::idempotency::store::{Claim, ClaimToken};
use crate::sql::{self, Dialect, Sql, Value};

impl SqlIdempotencyStore {
    /// Claims every key of `keys` (distinct) on the caller's transaction in one statement,
    /// all under `token`; the claim of each, in order. A batch of claims is fenced by its
    /// one token exactly as a single claim is by its own.
    pub(crate) fn claim_many_in(
        &self,
        tx: &mut dyn Sql,
        keys: &[&str],
        token: &ClaimToken,
    ) -> Result<Vec<Claim>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let dialect = tx.dialect();
        let sql = dialect.placeholders(&claim_sql(&self.table, dialect, 3, keys.len()));
        // The rows in key order: concurrent batches (other groups, other consumers) then
        // lock the keys they share in the same order, so they wait for each other instead
        // of deadlocking. The answers below go by key, in `keys`' order.
        let mut ordered: Vec<&str> = keys.to_vec();
        ordered.sort_unstable();
        let mut params = Vec::with_capacity(keys.len() + 2);
        params.push(Value::Integer(sql::duration_ms(self.claim_timeout)));
        params.push(Value::Text(token.as_str().to_owned()));
        params.extend(ordered.iter().map(|k| Value::Text((*k).to_owned())));
        let mut states = HashMap::new();
        let claimed = if dialect == Dialect::Mysql {
            // No `RETURNING`: the keys the (fresh) token holds after the statement are the
            // ones it took; the others' states come with them.
            tx.execute(&sql, &params)
                .map_err(|e| self.context(e, "claiming a batch of keys"))?;
            let mut claimed = HashSet::new();
            for (key, state, holder) in self.key_states(tx, &params[2..])? {
                if holder.as_deref() == Some(token.as_str()) {
                    claimed.insert(key);
                } else {
                    states.insert(key, state);
                }
            }
            claimed
        } else {
            let claimed = self.returned_keys(tx, &sql, &params, "claiming a batch of keys")?;
            let others: Vec<Value> = keys
                .iter()
                .filter(|k| !claimed.contains(**k))
                .map(|k| Value::Text((*k).to_owned()))
                .collect();
            if !others.is_empty() {
                for (key, state, _) in self.key_states(tx, &others)? {
                    states.insert(key, state);
                }
            }
            claimed
        };
        Ok(keys
            .iter()
            .map(|k| claim_answer(claimed.contains(*k), states.get(*k), token))
            .collect())
    }

    /// Confirms the claims `token` holds on `keys` on the caller's transaction (one
    /// statement; a key no longer held is confirmed on its own, as `confirm_in` does).
    pub(crate) fn confirm_many_in(
        &self,
        tx: &mut dyn Sql,
        keys: &[&str],
        token: &ClaimToken,
    ) -> Result<()> {
        let pairs: Vec<(&str, &ClaimToken)> = keys.iter().map(|k| (*k, token)).collect();
        self.confirm_pairs_in(tx, &pairs)
    }

    /// Each of `keys`' rows (those there are): key, state, token.
    fn key_states(
        &self,
        tx: &mut dyn Sql,
        keys: &[Value],
    ) -> Result<Vec<(String, String, Option<String>)>> {
        let dialect = tx.dialect();
        let sql = dialect.placeholders(&select_keys_sql(&self.table, dialect, 1, keys.len()));
        tx.query(&sql, keys)
            .map_err(|e| self.context(e, "reading the batch's keys"))?
            .iter()
            .map(|row| {
                Ok((
                    sql::col_text(row, 0)?,
                    sql::col_text(row, 1)?,
                    sql::col_opt_text(row, 2)?,
                ))
            })
            .collect()
    }

    /// Runs `sql` (a statement `… RETURNING key`) and returns the keys it returned.
    pub(super) fn returned_keys(
        &self,
        tx: &mut dyn Sql,
        sql: &str,
        params: &[Value],
        what: &str,
    ) -> Result<HashSet<String>> {
        tx.query(sql, params)
            .map_err(|e| self.context(e, what))?
            .iter()
            .map(|row| sql::col_text(row, 0))
            .collect()
    }

    /// Confirms claims held by different tokens in one statement (a group commit's
    /// confirms: each comes from the group that claimed it). A pair whose token no longer
    /// holds its key is confirmed on its own, as `confirm_in` does.
    pub(super) fn confirm_pairs_in(
        &self,
        tx: &mut dyn Sql,
        pairs: &[(&str, &ClaimToken)],
    ) -> Result<()> {
        if pairs.is_empty() {
            return Ok(());
        }
        let dialect = tx.dialect();
        // Keys in order, as the claims insert them: concurrent groups lock shared rows in
        // the same order.
        let mut ordered = pairs.to_vec();
        ordered.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let sql = dialect.placeholders(&confirm_sql(&self.table, dialect, 1, 2, ordered.len()));
        let mut params = Vec::with_capacity(2 * ordered.len() + 1);
        params.push(Value::Integer(sql::duration_ms(self.retention)));
        for (key, token) in &ordered {
            params.push(Value::Text((*key).to_owned()));
            params.push(Value::Text(token.as_str().to_owned()));
        }
        let confirmed = if dialect == Dialect::Mysql {
            // No `RETURNING`: the pairs still held are read and locked first (so they are
            // still held when the update runs), then updated.
            let keys: Vec<Value> = ordered
                .iter()
                .map(|(k, _)| Value::Text((*k).to_owned()))
                .collect();
            let held: HashSet<String> = self
                .key_states(tx, &keys)?
                .into_iter()
                .filter(|(key, state, holder)| {
                    state == CLAIMED
                        && ordered.iter().any(|(k, t)| {
                            *k == key.as_str() && holder.as_deref() == Some(t.as_str())
                        })
                })
                .map(|(key, _, _)| key)
                .collect();
            if !held.is_empty() {
                tx.execute(&sql, &params)
                    .map_err(|e| self.context(e, "confirming a group's keys"))?;
            }
            held
        } else {
            self.returned_keys(tx, &sql, &params, "confirming a group's keys")?
        };
        for (key, token) in &ordered {
            if !confirmed.contains(*key) {
                self.confirm_on(tx, key, token)?;
            }
        }
        Ok(())
    }

    /// Gives back the claims `token` holds on `keys` on the caller's transaction.
    pub(crate) fn release_many_in(
        &self,
        tx: &mut dyn Sql,
        keys: &[&str],
        token: &ClaimToken,
    ) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let dialect = tx.dialect();
        let sql = dialect.placeholders(&format!(
            "DELETE FROM {} WHERE state = '{CLAIMED}' AND token = $1 AND {} IN ({})",
            self.table,
            dialect.column("key"),
            (2..keys.len() + 2)
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let mut params = Vec::with_capacity(keys.len() + 1);
        params.push(Value::Text(token.as_str().to_owned()));
        params.extend(keys.iter().map(|k| Value::Text((*k).to_owned())));
        tx.execute(&sql, &params)
            .map_err(|e| self.context(e, "releasing a batch of claims"))?;
        Ok(())
    }
}

/// A claim's answer from whether the statement took the key and, if not, the state the key
/// was found in: a receipt is a duplicate; a live claim (or a row deleted meanwhile) is in
/// progress, and the message comes back later.
pub(super) fn claim_answer(taken: bool, state: Option<&String>, token: &ClaimToken) -> Claim {
    if taken {
        Claim::Claimed(token.clone())
    } else if state.map(String::as_str) == Some(CONFIRMED) {
        Claim::Duplicate
    } else {
        Claim::InProgress
    }
}
