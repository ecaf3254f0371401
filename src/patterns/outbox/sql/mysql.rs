//! The outbox's leases on MySQL, which has no `UPDATE … RETURNING`: one transaction reads the
//! rows to lease with `SELECT … FOR UPDATE SKIP LOCKED` (rows another relay is leasing right
//! now are skipped, not waited for; a row leased before is not picked, its `lease_until_ms`
//! being ahead) and writes the lease on exactly those, which it holds locked until its commit.
//! Two relays on one table therefore never lease one row at once, as with PostgreSQL's single
//! statement. Renewals read (and lock) the leases still held, then extend them.

use std::time::Duration;

use super::statements::Statements;
use crate::error::{Error, Result};
use crate::sql::{self, Sql, Value};

/// Leases up to `limit` records for `owner`, after deleting `published` (the relay's
/// delete-and-lease) when there are any, in one transaction: the leased rows, as `pending`
/// reads them.
pub(super) fn lease(
    conn: &mut dyn Sql,
    s: &Statements,
    published: &[i64],
    (owner, lease, max_attempts, limit): (&str, Duration, u32, usize),
    context: impl Fn(Error, &str) -> Error,
) -> Result<Vec<Vec<Value>>> {
    let (pick, params) = s.lease(owner, lease, max_attempts, limit);
    sql::in_one_transaction(conn, "a lease", &context, |tx| {
        if !published.is_empty() {
            tx.execute(&s.delete_many(published.len()), &s.id_params(published))
                .map_err(|e| context(e, "deleting published records"))?;
        }
        // The deleted rows are gone for this transaction's own read too.
        let rows = tx
            .query(&pick, &params)
            .map_err(|e| context(e, "leasing pending records"))?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let ids = rows
            .iter()
            .map(|row| sql::col_i64(row, 0))
            .collect::<Result<Vec<i64>>>()?;
        let mut lease_params = params[..2].to_vec();
        lease_params.extend(s.id_params(&ids));
        tx.execute(&s.lease_ids(ids.len()), &lease_params)
            .map_err(|e| context(e, "leasing pending records"))?;
        Ok(rows)
    })
}

/// Extends the leases `owner` still holds among `ids` (at most 500) by `lease` from now, in one
/// transaction: the ids renewed.
pub(super) fn renew(
    conn: &mut dyn Sql,
    s: &Statements,
    owner: &str,
    lease: Duration,
    ids: &[i64],
    context: impl Fn(Error, &str) -> Error,
) -> Result<Vec<i64>> {
    let mut params = vec![
        Value::Text(owner.to_owned()),
        Value::Integer(sql::duration_ms(lease)),
    ];
    params.extend(s.id_params(ids));
    sql::in_one_transaction(conn, "a renewal", &context, |tx| {
        let held = tx
            .query(&s.held_many(ids.len()), &params)
            .map_err(|e| context(e, "renewing leases"))?
            .iter()
            .map(|row| sql::col_i64(row, 0))
            .collect::<Result<Vec<i64>>>()?;
        if !held.is_empty() {
            let mut renew = params[..2].to_vec();
            renew.extend(s.id_params(&held));
            tx.execute(&s.renew_many(held.len()), &renew)
                .map_err(|e| context(e, "renewing leases"))?;
        }
        Ok(held)
    })
}
