//! [`RunningService`]: a started service — watched until it is asked to stop, paused and
//! resumed as one, drained in order within its deadline.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select};

use super::options::{Connections, Factory, ServiceOptions};
use super::part::{ServicePart, Stage};
use super::report::{PartReport, ServiceReport, StopReason};
use super::signals::Signals;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::health::{HealthCheckOptions, HealthReport};
use crate::stop::StopHandle;

/// How often the host looks whether a part has ended on its own.
const WATCH: Duration = Duration::from_millis(250);

/// A service whose parts run. [`wait`](Self::wait) until it is asked to stop, or
/// [`stop`](Self::stop) it; dropping it stops it too.
pub struct RunningService {
    options: ServiceOptions,
    connections: Connections,
    parts: Vec<(String, Box<dyn ServicePart>)>,
    #[cfg(feature = "actuator")]
    actuator: Option<crate::actuator::RunningActuator>,
    stop: StopHandle,
    stop_rx: Receiver<()>,
    signals: Option<Signals>,
    stopped: bool,
}

impl std::fmt::Debug for RunningService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningService")
            .field("options", &self.options)
            .field("parts", &self.part_names())
            .finish_non_exhaustive()
    }
}

fn open(options: &ServiceOptions, role: &str) -> Result<Connection> {
    Connection::open_with(
        options
            .connection
            .clone()
            .name(format!("{}-{role}", options.name))
            .service(options.name.clone()),
    )
}

impl RunningService {
    pub(super) fn start(
        options: ServiceOptions,
        parts: Vec<(String, Factory)>,
    ) -> Result<RunningService> {
        let publishing = open(&options, "publish")?;
        let consuming = open(&options, "consume")?;
        if let Some((topology, mode)) = &options.topology {
            let plan = topology.apply(&consuming, *mode)?;
            log::info!("acemq: {}'s topology ({mode:?}):\n{plan}", options.name);
        }
        let watched = publishing.clone();
        consuming.add_health_check(
            "connection:publishing",
            HealthCheckOptions::new(),
            move || {
                let h = watched.health();
                HealthReport::new(h.status, h.detail)
            },
        )?;
        let (wake, stop_rx) = crossbeam_channel::bounded(1);
        let stop = StopHandle::with_waker(Default::default(), wake);
        let signals = if options.signals {
            Some(Signals::listen()?)
        } else {
            None
        };
        let mut running = RunningService {
            options,
            connections: Connections {
                publishing,
                consuming,
            },
            parts: Vec::with_capacity(parts.len()),
            #[cfg(feature = "actuator")]
            actuator: None,
            stop,
            stop_rx,
            signals,
            stopped: false,
        };
        for (name, start) in parts {
            match start(&running.connections) {
                Ok(part) => {
                    log::info!("acemq: {} started {name}", running.options.name);
                    running.parts.push((name, part));
                }
                Err(e) => {
                    let report = running.drain(StopReason::Asked);
                    log::warn!("acemq: {name} could not start; {report}");
                    return Err(e);
                }
            }
        }
        #[cfg(feature = "actuator")]
        if let Some(options) = running.options.actuator.clone() {
            let actuator = crate::actuator::Actuator::new(&running.connections.consuming, options)
                .and_then(crate::actuator::Actuator::start);
            match actuator {
                Ok(a) => running.actuator = Some(a),
                Err(e) => {
                    running.drain(StopReason::Asked);
                    return Err(e);
                }
            }
        }
        Ok(running)
    }

    /// The connections the parts run on.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// The parts' names, in the order they started.
    pub fn part_names(&self) -> Vec<&str> {
        self.parts.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// A handle that stops the service from any thread: [`wait`](Self::wait) then drains.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The actuator's address, when it has one.
    #[cfg(feature = "actuator")]
    pub fn actuator_addr(&self) -> Option<std::net::SocketAddr> {
        self.actuator
            .as_ref()
            .map(crate::actuator::RunningActuator::local_addr)
    }

    /// Pauses every part that takes deliveries (consumers, responders): each stops taking
    /// them, finishes what runs and gives back what it had received. Readiness stays up.
    ///
    /// # Errors
    ///
    /// The first part that could not pause (the others are still paused).
    pub fn pause(&self) -> Result<()> {
        self.each(|p| p.pause())
    }

    /// Resumes every part [`pause`](Self::pause) paused.
    ///
    /// # Errors
    ///
    /// The first part that could not resume.
    pub fn resume(&self) -> Result<()> {
        self.each(|p| p.resume())
    }

    /// Runs `concurrency` handlers at once in part `name` from now on (a consumer's or a
    /// responder's subscription ends as for a pause and starts again with the new number).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an unknown part, one that cannot scale, or a bad number.
    pub fn scale_to(&self, name: &str, concurrency: usize) -> Result<()> {
        match self.parts.iter().find(|(n, _)| n == name) {
            Some((_, p)) => p.scale_to(concurrency),
            None => Err(Error::invalid(format!(
                "no part named {name:?}; the parts are {:?}",
                self.part_names()
            ))),
        }
    }

    fn each(&self, f: impl Fn(&dyn ServicePart) -> Result<()>) -> Result<()> {
        let mut first = Ok(());
        for (name, part) in &self.parts {
            if let Err(e) = f(part.as_ref()) {
                log::warn!("acemq: {name}: {e}");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Blocks until the service is asked to stop — SIGTERM or SIGINT (when
    /// [`ServiceOptions::signals`] is on), its [`StopHandle`], or a part ending on its own —
    /// then drains it ([`stop`](Self::stop) says in which order) and returns the report.
    pub fn wait(mut self) -> ServiceReport {
        let reason = self.wait_for_stop();
        self.drain(reason)
    }

    /// Drains the service now, within its deadline, and returns the report: readiness turns
    /// down (the actuator answers 503 `draining`); the consumers stop taking deliveries
    /// (`basic.cancel`), their running handlers finish and what was received and not started
    /// goes back to the queue without spending RabbitMQ 4.x's delivery limit; the relays make
    /// a last sweep and stop; the responders and the scheduler stop; the actuator and the
    /// connections close. Each step gets what is left of the deadline; a handler still running
    /// at it is abandoned (its delivery given back) and counted in the report.
    pub fn stop(mut self) -> ServiceReport {
        self.drain(StopReason::Asked)
    }

    /// [`stop`](Self::stop) with `deadline` instead of the options' drain timeout.
    pub fn drain_within(mut self, deadline: Duration) -> ServiceReport {
        self.options.drain_timeout = deadline;
        self.drain(StopReason::Asked)
    }

    fn wait_for_stop(&self) -> StopReason {
        let never = crossbeam_channel::never();
        let signals = self.signals.as_ref().map_or(&never, Signals::receiver);
        loop {
            let mut select = Select::new();
            let on_signal = select.recv(signals);
            let on_stop = select.recv(&self.stop_rx);
            match select.select_timeout(WATCH) {
                Ok(op) if op.index() == on_signal => {
                    if let Ok(n) = op.recv(signals) {
                        log::info!("acemq: {} received signal {n}: draining", self.options.name);
                        return StopReason::Signal(n);
                    }
                }
                Ok(op) if op.index() == on_stop => {
                    let _ = op.recv(&self.stop_rx);
                    return StopReason::Asked;
                }
                _ => {}
            }
            if let Some((name, _)) = self.parts.iter().find(|(_, p)| p.is_finished()) {
                log::error!("acemq: {name} ended on its own: stopping the service");
                return StopReason::PartFailed { part: name.clone() };
            }
        }
    }

    fn drain(&mut self, reason: StopReason) -> ServiceReport {
        self.stopped = true;
        let began = Instant::now();
        let deadline = self.options.drain_timeout;
        let end = began + deadline;
        #[cfg(feature = "actuator")]
        if let Some(a) = &self.actuator {
            a.set_draining(true);
        }
        let mut reports = Vec::with_capacity(self.parts.len());
        let mut parts = std::mem::take(&mut self.parts);
        for stage in [Stage::Consumers, Stage::Relays, Stage::Last] {
            let (now, later): (Vec<_>, Vec<_>) =
                parts.into_iter().partition(|(_, p)| p.stage() == stage);
            parts = later;
            reports.extend(stop_together(now, end));
        }
        #[cfg(feature = "actuator")]
        if let Some(a) = self.actuator.take() {
            if let Err(e) = a.close() {
                log::warn!("acemq: closing the actuator: {e}");
            }
        }
        for c in [&self.connections.consuming, &self.connections.publishing] {
            if let Err(e) = c.close() {
                log::warn!("acemq: closing a connection of {}: {e}", self.options.name);
            }
        }
        if let Some(s) = self.signals.take() {
            s.close();
        }
        let report = ServiceReport {
            service: self.options.name.clone(),
            reason,
            drained_in: began.elapsed(),
            deadline,
            parts: reports,
        };
        log::info!("acemq: {report}");
        report
    }
}

/// Stops `parts` at once, each on its own thread, each with what is left until `end`.
fn stop_together(parts: Vec<(String, Box<dyn ServicePart>)>, end: Instant) -> Vec<PartReport> {
    std::thread::scope(|s| {
        let stopping: Vec<_> = parts
            .into_iter()
            .map(|(name, part)| {
                let left = end.saturating_duration_since(Instant::now());
                (name, s.spawn(move || part.stop(left)))
            })
            .collect();
        stopping
            .into_iter()
            .map(|(name, t)| {
                let mut report = t.join().unwrap_or_else(|_| PartReport {
                    error: Some("it panicked while stopping".into()),
                    ..PartReport::default()
                });
                report.name = name;
                report
            })
            .collect()
    })
}

impl Drop for RunningService {
    /// Drains as [`stop`](RunningService::stop) does, unless that ran already.
    fn drop(&mut self) {
        if !self.stopped {
            self.drain(StopReason::Asked);
        }
    }
}
