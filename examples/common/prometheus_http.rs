//! A Prometheus scrape endpoint on a std `TcpListener`: `GET /metrics` answers the recorder's
//! text, anything else 404. No async runtime; one short-lived connection at a time, each read
//! bounded (8 KiB, 5 s). Used by the scrape test (`tests/metrics.rs`); `scrape_path` also reads the
//! `advanced_health_and_metrics` example's `/acemq-metrics`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus recorder as the process's `metrics` recorder (once per process).
pub fn install() -> PrometheusHandle {
    PrometheusBuilder::new()
        .install_recorder()
        .expect("a metrics recorder is already installed in this process")
}

/// Serves `handle` on `listener` from a thread of its own (`acemq-metrics-http`), for the life
/// of the process.
pub fn serve(listener: TcpListener, handle: PrometheusHandle) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("acemq-metrics-http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(s) => {
                        let _ = answer(s, &handle);
                    }
                    Err(e) => eprintln!("metrics endpoint: accept failed: {e}"),
                }
            }
        })
        .expect("spawn the metrics endpoint thread")
}

fn answer(mut s: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let first = String::from_utf8_lossy(&head);
    let path = first.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if first.starts_with("GET ") && (path == "/metrics" || path == "/") {
        handle.run_upkeep();
        ("200 OK", handle.render())
    } else {
        ("404 Not Found", "not found\n".to_string())
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}

/// Scrapes `http://{addr}/metrics` over loopback (what Prometheus does), with deadlines.
pub fn scrape(addr: std::net::SocketAddr) -> std::io::Result<String> {
    scrape_path(addr, "/metrics")
}

/// `GET path` on `addr`: the body of a 200 answer.
pub fn scrape_path(addr: std::net::SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(std::io::Error::other(format!("bad answer: {text:.200}"))),
    }
}
