//! A capture of this test binary's log lines (all its tests share the one global logger), each
//! kept as `target message`.

use std::sync::Mutex;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        LINES
            .lock()
            .unwrap()
            .push(format!("{} {}", record.target(), record.args()));
    }

    fn flush(&self) {}
}

/// Installs the capture at `level`, once per binary; false when a logger was already installed
/// (by an earlier call, or another logger).
pub fn capture(level: log::LevelFilter) -> bool {
    let installed = log::set_logger(&Capture).is_ok();
    if installed {
        log::set_max_level(level);
    }
    installed
}

/// The lines captured so far.
pub fn lines() -> Vec<String> {
    LINES.lock().unwrap().clone()
}
