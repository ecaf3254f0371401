//! A real HTTP client (`ureq`) for the actuator's endpoints (tests/actuator.rs, tests/service.rs).
//! Behind the library's `actuator` feature: `ureq` is this package's dev-dependency, which the
//! command line's tests (that take in `support` by path, without the feature) do not have.

use std::net::SocketAddr;
use std::time::Duration;

/// GET `path`: the status and the body (any status, within 20 s); fails the test if no answer.
pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_within(addr, path, Duration::from_secs(20)).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// GET `path` with the whole call (connect, request, answer) bounded by `within`: the status
/// and the body, or the client's error (a timeout).
pub fn get_within(
    addr: SocketAddr,
    path: &str,
    within: Duration,
) -> Result<(u16, String), ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(within))
        .build()
        .into();
    let mut response = agent.get(&format!("http://{addr}{path}")).call()?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string()?;
    Ok((status, body))
}
