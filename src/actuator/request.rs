//! One HTTP/1.x exchange on a socket, every part bounded: the request head read within a
//! deadline and at most [`MAX_HEAD`] bytes (the request line read, the headers skipped, a body
//! never read), the answer written within a deadline, always with `Connection: close`.
//!
//! Only what the actuator needs: GET and HEAD, one request per connection. No keep-alive and
//! no request bodies, so there is no framing to disagree about (request smuggling needs a
//! second request on the connection, or a body).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// The most bytes a request line and its headers may take (the blank line included).
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// The most bytes read (and dropped) after the answer while waiting for the client to close,
/// so that closing with unread bytes does not reset the connection under the answer.
const MAX_DRAINED: usize = 64 * 1024;

/// How long, after the answer, the client is given to close before the socket is dropped.
const LINGER: Duration = Duration::from_secs(1);

/// A request the actuator answers: GET or HEAD, and the path (without query or fragment).
#[derive(Debug, PartialEq)]
pub(super) struct Request {
    pub(super) head_only: bool,
    pub(super) path: String,
}

/// An answer: the status, the content type and the body (left out for HEAD).
#[derive(Debug)]
pub(super) struct Response {
    pub(super) status: u16,
    pub(super) content_type: &'static str,
    pub(super) body: String,
}

impl Response {
    pub(super) fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub(super) fn json(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: body.into(),
        }
    }
}

/// Why no request came.
#[derive(Debug)]
pub(super) enum NoRequest {
    /// The deadline passed before the head was complete (answered 408).
    TimedOut,
    /// The head grew past [`MAX_HEAD`] (answered 431).
    TooLarge,
    /// The client closed, or the socket failed (not answered).
    Gone,
}

/// Reads the request head (up to its blank line) by `deadline`, at most [`MAX_HEAD`] bytes.
pub(super) fn read_head(stream: &mut TcpStream, deadline: Instant) -> Result<Vec<u8>, NoRequest> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NoRequest::TimedOut);
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|_| NoRequest::Gone)?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(NoRequest::Gone),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(NoRequest::TimedOut)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Err(NoRequest::Gone),
        };
        // The blank line may straddle two reads: look again from three bytes back.
        let from = head.len().saturating_sub(3);
        let room = MAX_HEAD - head.len();
        head.extend_from_slice(&chunk[..n.min(room)]);
        if let Some(end) = head_end(&head[from..]) {
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() >= MAX_HEAD {
            return Err(NoRequest::TooLarge);
        }
    }
}

/// Where the head ends in `bytes`: the index just past the line feed of its blank line
/// (`\r\n\r\n` or, leniently, `\n\n`).
fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).enumerate().find_map(|(i, w)| match w {
        [b'\n', b'\n'] => Some(i + 2),
        [b'\n', b'\r'] if bytes.get(i + 2) == Some(&b'\n') => Some(i + 3),
        _ => None,
    })
}

/// The request in `head`, or the answer to give instead (400, 405, 505).
pub(super) fn parse(head: &[u8]) -> Result<Request, Response> {
    let bad = || Response::text(400, "bad request\n");
    // A server should ignore empty lines before the request line (RFC 9112, 2.2).
    let start = head
        .iter()
        .position(|b| *b != b'\r' && *b != b'\n')
        .ok_or_else(bad)?;
    let head = &head[start..];
    let line_end = head.iter().position(|b| *b == b'\n').ok_or_else(bad)?;
    let line = head[..line_end]
        .strip_suffix(b"\r")
        .unwrap_or(&head[..line_end]);
    let line = std::str::from_utf8(line).map_err(|_| bad())?;
    if line.chars().any(|c| c.is_control()) {
        return Err(bad());
    }
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(bad());
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
        return Err(bad());
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err(if version.starts_with("HTTP/") {
            Response::text(505, "only HTTP/1.1 and HTTP/1.0\n")
        } else {
            bad()
        });
    }
    let path = path_of(target).ok_or_else(bad)?;
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Err(Response::text(405, "only GET and HEAD\n")),
    };
    Ok(Request {
        head_only,
        path: path.to_string(),
    })
}

/// The path of a request target: origin form (`/p?q`) or absolute form (`http://h/p?q`); the
/// query and any fragment cut off.
fn path_of(target: &str) -> Option<&str> {
    let path = if target.starts_with('/') {
        target
    } else {
        let rest = target
            .strip_prefix("http://")
            .or_else(|| target.strip_prefix("https://"))?;
        match rest.find('/') {
            Some(i) => &rest[i..],
            None => "/",
        }
    };
    let end = path.find(['?', '#']).unwrap_or(path.len());
    Some(&path[..end])
}

/// The bytes of `response`: status line, headers, and the body unless `head_only`.
pub(super) fn encode(response: &Response, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: \
         no-store\r\nConnection: close\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len(),
    );
    if response.status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(response.body.as_bytes());
    }
    out
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Writes `bytes` by `deadline` (each write waits at most what is left of it), then closes the
/// sending side and reads what the client still sends until it closes, for at most [`LINGER`]
/// and [`MAX_DRAINED`] bytes.
pub(super) fn send(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < bytes.len() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(&bytes[sent..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    stream.shutdown(Shutdown::Write)?;
    let deadline = Instant::now() + LINGER;
    let mut drained = 0;
    let mut chunk = [0u8; 2048];
    // The answer is out: whatever happens now (the linger over, a reset) changes nothing.
    while drained < MAX_DRAINED {
        let Ok(left) = left(deadline) else { break };
        if stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    Ok(())
}

/// What is left until `deadline`, or a timed-out error when nothing is.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(line: &str) -> Result<Request, u16> {
        parse(format!("{line}\r\nHost: x\r\n\r\n").as_bytes()).map_err(|r| r.status)
    }

    #[test]
    fn the_request_line_gives_the_method_and_the_path() {
        let get = |path: &str| {
            Ok(Request {
                head_only: false,
                path: path.into(),
            })
        };
        assert_eq!(request("GET /acemq-health HTTP/1.1"), get("/acemq-health"));
        assert_eq!(request("GET /readyz?full=1#x HTTP/1.0"), get("/readyz"));
        assert_eq!(request("GET http://h:9464/livez?x HTTP/1.1"), get("/livez"));
        assert_eq!(request("GET http://h:9464 HTTP/1.1"), get("/"));
        assert_eq!(
            parse(b"\r\nHEAD /livez HTTP/1.1\n\n").map_err(|r| r.status),
            Ok(Request {
                head_only: true,
                path: "/livez".into()
            })
        );
        assert_eq!(request("POST /livez HTTP/1.1"), Err(405));
        assert_eq!(request("GET /livez HTTP/2.0"), Err(505));
        for bad in [
            "GET /livez",
            "GET  /livez HTTP/1.1",
            "GET /livez HTTP/1.1 x",
            "GET livez HTTP/1.1",
            "G3T /livez HTTP/1.1",
            "GET /li\u{7f}vez HTTP/1.1",
            "GET /livez HTTQ/1.1",
        ] {
            assert_eq!(request(bad), Err(400), "{bad:?}");
        }
    }

    #[test]
    fn the_head_ends_at_its_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nbody"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }

    #[test]
    fn head_answers_carry_the_length_but_not_the_body() {
        let r = Response::json(200, "{\"status\":\"up\"}");
        let full = String::from_utf8(encode(&r, false)).unwrap();
        let head = String::from_utf8(encode(&r, true)).unwrap();
        assert!(full.starts_with("HTTP/1.1 200 OK\r\n"), "{full}");
        assert!(full.contains("Content-Length: 15\r\n"), "{full}");
        assert!(full.contains("Connection: close\r\n"), "{full}");
        assert!(full.ends_with("\r\n\r\n{\"status\":\"up\"}"), "{full}");
        assert_eq!(head, full.trim_end_matches("{\"status\":\"up\"}"));
        let refused = String::from_utf8(encode(&Response::text(405, ""), false)).unwrap();
        assert!(refused.contains("Allow: GET, HEAD\r\n"), "{refused}");
    }

    proptest! {
        /// Whatever bytes come, parsing answers (a request or a 4xx/5xx) without panicking,
        /// and a path it gives holds no query, fragment or control character.
        #[test]
        fn any_bytes_parse_to_a_request_or_an_error_answer(
            bytes in proptest::collection::vec(any::<u8>(), 0..512)
        ) {
            match parse(&bytes) {
                Ok(r) => prop_assert!(
                    r.path.starts_with('/')
                        && !r.path.contains(['?', '#'])
                        && !r.path.chars().any(|c| c.is_control())
                ),
                Err(r) => prop_assert!(r.status >= 400),
            }
            let _ = head_end(&bytes);
        }

        /// Request lines near the real ones: GET and HEAD of an origin-form target give its
        /// path up to the query; anything else is an error answer.
        #[test]
        fn near_requests_give_their_path_or_an_error_answer(
            method in "(GET|HEAD|POST|G T|get)",
            path in "/[!-~]{0,40}",
            version in "HTTP/(1\\.[0-2]|2)",
            headers in "([!-~]{1,10}: [ -~]{0,20}\r\n){0,3}",
        ) {
            let head = format!("{method} {path} {version}\r\n{headers}\r\n");
            prop_assert_eq!(head_end(head.as_bytes()), Some(head.len()));
            let ok = matches!(method.as_str(), "GET" | "HEAD")
                && matches!(version.as_str(), "HTTP/1.0" | "HTTP/1.1");
            match parse(head.as_bytes()) {
                Ok(r) => {
                    prop_assert!(ok, "{head:?}");
                    prop_assert_eq!(r.head_only, method == "HEAD");
                    let end = path.find(['?', '#']).unwrap_or(path.len());
                    prop_assert_eq!(r.path, &path[..end]);
                }
                Err(r) => prop_assert!(!ok && r.status >= 400, "{head:?}: {}", r.status),
            }
        }
    }
}
