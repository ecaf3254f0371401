//! Graceful shutdown: a consumer is busy with slow messages when the service is told to stop
//! (here from another thread, as a signal handler would, through a `StopHandle`). It stops
//! taking new messages, lets the running handlers finish, requeues what it had not started, and
//! reports; nothing is lost and nothing is half done.
//! Run: `cargo run --example intermediate_graceful_shutdown`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let queue = ex::name("reports");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    let publisher = connection.publisher()?;
    for i in 0..20 {
        publisher.publish("", &queue, Message::new(format!("report {i}")))?;
    }
    let (started, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (s, f) = (started.clone(), finished.clone());
    let consumer = connection
        .consumer(
            &queue,
            ConsumerOptions::new()
                .concurrency(2)
                .prefetch(8)
                .shutdown_timeout(Duration::from_secs(10)),
        )?
        .start(move |m: &Message| {
            s.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300)); // rendering a report
            f.fetch_add(1, Ordering::SeqCst);
            println!("  finished {}", String::from_utf8_lossy(&m.body));
            Ok(Outcome::Accept)
        })?;
    let stop = consumer.stop_handle();
    ex::wait_for("a few reports under way", || {
        started.load(Ordering::SeqCst) >= 3
    });
    println!("stop requested while handlers are running");
    stop.stop(); // from any thread: a signal handler, a health check, an admin endpoint
    let report = consumer.close()?;
    println!(
        "closed: {} finished during shutdown, {} requeued unstarted, {} abandoned",
        report.finished_in_time, report.requeued, report.abandoned
    );
    let left = connection.queue_info(&queue)?.message_count;
    println!(
        "{} handled in all, {left} back on the queue for the next instance: {} of 20 accounted for",
        finished.load(Ordering::SeqCst),
        finished.load(Ordering::SeqCst) + left as usize
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
