//! Contract tests of a consumer's end: a consumer dropped as soon as its cancel is answered
//! leaves its channel and its connection working.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{both, declare, send};
use crate::transport::{AmqpProperties, ConsumerOptions, FieldTable};

/// amiquip's I/O thread answers a cancel in two steps: the caller's `CancelOk` first, then
/// the consumer's own "cancelled". A consumer whose receivers are all gone between the two
/// made it stop the whole connection ("i/o loop thread tried to communicate with a nonexistent
/// client"). Busy threads make the I/O thread lose its core between the two, as on a loaded
/// machine.
#[test]
fn consumers_dropped_as_soon_as_cancelled_leave_the_connection_up() {
    both("dropped", |s| {
        let mut t = s.connect();
        let ch = t.open_channel().unwrap();
        let q = s.queue("q");
        declare(&ch, &q, FieldTable::new());
        send(&ch, "", &q, "waiting", AmqpProperties::default());
        let stop = AtomicBool::new(false);
        let mut out = Vec::new();
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            let mut failed = None;
            for i in 0..400 {
                match ch.basic_consume(&q, ConsumerOptions::default()) {
                    Ok(consumer) => drop(consumer),
                    Err(e) => {
                        failed = Some(format!("consume {i}: {e:?}"));
                        break;
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
            assert_eq!(
                failed, None,
                "the connection died under consumers being dropped"
            );
            out.push("every consume answered".into());
        });
        let opened = t.open_channel().map(|c| c.close());
        assert!(
            matches!(opened, Ok(Ok(()))),
            "a channel opened after consumers were dropped: {opened:?}"
        );
        out.push("a new channel opens".into());
        out
    });
}
