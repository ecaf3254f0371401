//! Routing slips: the itinerary travels with the message; each step does its part and sends it
//! on to the next stop written on the slip.
//!
//! ```no_run
//! use acemq_amqp::{Connection, ConsumerOptions, Message};
//! use acemq_amqp::patterns::routing_slip::{follow_slip, RoutingSlip, FollowSlipOptions};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let publisher = connection.publisher()?;
//! let slip = RoutingSlip::new()
//!     .then("", "orders.validate", "validate")
//!     .then("", "orders.charge", "charge");
//! slip.send(&publisher, Message::new(r#"{"order":"o-1"}"#))?;
//!
//! // In the service behind `orders.validate`: run the step, and the message goes on.
//! let running = connection
//!     .consumer("orders.validate", ConsumerOptions::new())?
//!     .start(follow_slip(&publisher, |m: &Message| {
//!         // … validate m …; Ok(None) sends the payload on unchanged, Ok(Some(m)) a new one.
//!         Ok(None)
//!     }, FollowSlipOptions::new()))?;
//! # running.close()?; Ok(()) }
//! ```
//!
//! # The two wire forms (both read, exactly as the family writes them)
//!
//! **JSON** (the default, self-describing; Go, Python and Ruby write it): the application
//! header `acemq-routing-slip` (a long string) holds
//!
//! ```text
//! {"steps":[{"exchange":"orders","routingKey":"order.charge","name":"charge"}],"done":[{"exchange":"orders","routingKey":"order.validate","name":"validate","completedAt":"2026-11-30T14:12:36Z"}]}
//! ```
//!
//! `steps` are the stops still to do, the first being the one the message is at now; `done`
//! the completed ones, oldest first. Each step has `exchange` (`""` = the default exchange) and
//! `routingKey`, and optionally `name` and `completedAt` (RFC 3339, UTC, whole seconds; written
//! as the step is completed). This crate writes the keys in that order, compact, omits `name`
//! and `completedAt` when unset and always writes `done`; it reads any JSON with that shape
//! (extra keys ignored; a missing or null string is empty; `done` may be missing; `steps`
//! missing is an empty, finished slip).
//!
//! **Declared** (the Java library's `Pipeline`): three reserved headers carry only names —
//! `x-acemq-route` = every step name, done and to do, comma-separated (`validate,charge,ship`),
//! `x-acemq-route-position` = a 32-bit integer, 0-based, the step the message is at (past the
//! end = finished; unreadable or negative = 0), `x-acemq-route-id` = the run's id (a fresh one
//! is written when a message arrives without one). Where a step goes is resolved by the reader:
//! with [`FollowSlipOptions::pipeline`]`("fulfilment")` the exchange is `fulfilment`, the routing key
//! the step name and the queue behind it `fulfilment.{step}` (see [`route_queue`]); without a
//! pipeline, step names are routing keys on the default exchange (queue = step name). The
//! route headers are engine headers: they are kept on retry, dead-letter and parked copies and
//! on a replay, so a replayed dead letter resumes its route.
//!
//! [`route_of`] and [`RoutingSlip::with_form`]`(SlipForm::StepNames)` write the declared form; a slip
//! that cannot be said in it — steps on two exchanges, a step with no name, a name that is not
//! its routing key, a name with a comma — is refused where it is built
//! ([`RoutingSlip::with_form`], [`route_of`], and [`RoutingSlip::send`] before anything is
//! published).
//!
//! # Reading, following
//!
//! * [`slip_from`]: `Ok(None)` when the message carries no slip; `Err(FatalError)` when it
//!   carries one that cannot be read (so a handler returning it dead-letters the message at
//!   once: it will not parse on the next attempt either); the JSON form first when both are
//!   present.
//! * [`follow_slip`] is a [`Handler`](crate::Handler): it reads the slip (unreadable or missing → fatal,
//!   dead-lettered), runs the step (an `Err` is a retry, a [`FatalError`](crate::FatalError) a reject, as for any
//!   handler), then publishes the step's payload — the one it returned, or the received body
//!   and content type unchanged — to the next stop, typed with that stop's routing key unless the
//!   step's message names its own type (as Go's and Python's slips do), **mandatory, with a
//!   confirm**, and accepts
//!   only once that hop is routed and confirmed; a hop that fails (no queue bound there, the
//!   broker refusing it, the connection lost) is a retry of this step. After the last step it
//!   just accepts. It writes back the form it read. The onward message carries the received
//!   correlation id, causation = the received message's id, and an id derived from the received
//!   id and the slip's position, so a step run twice (a redelivery) sends the same id onward
//!   and an idempotent next step sees a duplicate.
//! * A message whose slip is already finished when it arrives is accepted without running the
//!   step (logged at warn).

mod follow;
mod slip;
mod wire;

pub use follow::{follow_slip, FollowSlip, FollowSlipOptions};
pub use slip::{route_of, route_queue, RoutingSlip, SlipForm, SlipStep};
pub use wire::slip_from;

#[cfg(test)]
mod tests {
    use super::follow::hop_id;
    use super::*;
    use crate::envelope::{headers, HeaderValue, Message};

    #[test]
    fn the_json_form_is_exactly_the_familys() {
        let slip = RoutingSlip::new()
            .then("orders", "order.validate", "validate")
            .then("", "order.charge", "");
        assert_eq!(
            slip.to_json(),
            r#"{"steps":[{"exchange":"orders","routingKey":"order.validate","name":"validate"},{"exchange":"","routingKey":"order.charge"}],"done":[]}"#
        );
        let advanced = slip.advance();
        let json = advanced.to_json();
        assert!(json.starts_with(
            r#"{"steps":[{"exchange":"","routingKey":"order.charge"}],"done":[{"exchange":"orders","routingKey":"order.validate","name":"validate","completedAt":""#
        ), "{json}");
        assert_eq!(RoutingSlip::from_json(&json).unwrap(), advanced);
    }

    #[test]
    fn another_librarys_slip_reads() {
        // Python's json.dumps spacing, Go's omitted `done`, nulls, extra keys.
        let py = r#"{"steps": [{"exchange": "x", "routingKey": "a", "name": "a"}], "done": [{"exchange": "x", "routingKey": "z", "completedAt": "2026-01-02T03:04:05.123456+00:00"}]}"#;
        let s = RoutingSlip::from_json(py).unwrap();
        assert_eq!(s.next().unwrap().routing_key, "a");
        assert_eq!(s.done().len(), 1);
        let go = r#"{"steps":[{"exchange":"x","routingKey":"a","name":null,"extra":1}]}"#;
        let s = RoutingSlip::from_json(go).unwrap();
        assert!(s.done().is_empty() && s.next().unwrap().name.is_none());
        // A first slip both ways: Go omits an empty `done`, Python (and this crate) write
        // `"done": []`; each reads as the same slip.
        let omitted = RoutingSlip::from_json(r#"{"steps":[{"exchange":"x","routingKey":"a"}]}"#);
        let empty = RoutingSlip::from_json(
            r#"{"steps": [{"exchange": "x", "routingKey": "a"}], "done": []}"#,
        );
        assert_eq!(omitted.unwrap(), empty.unwrap());
        assert!(RoutingSlip::from_json("{not json").is_err());
        assert!(RoutingSlip::from_json(r#"{"steps":"nope"}"#).is_err());
    }

    #[test]
    fn the_declared_form_refuses_what_it_cannot_say() {
        let two = RoutingSlip::new().then("a", "s", "s").then("b", "t", "t");
        assert!(two.with_form(SlipForm::StepNames).is_err());
        let unnamed = RoutingSlip::new().then("a", "", "");
        assert!(unnamed.with_form(SlipForm::StepNames).is_err());
        let differs = RoutingSlip::new().then("a", "key", "name");
        assert!(differs.with_form(SlipForm::StepNames).is_err());
        assert!(route_of("p", &["a,b"]).is_err());
        assert!(route_of("p", &[]).is_err());
        let ok = route_of("p", &["a", "b"]).unwrap();
        assert_eq!(ok.form(), SlipForm::StepNames);
        assert!(ok.route_id().is_some());
    }

    #[test]
    fn the_declared_form_round_trips_through_a_message() {
        let slip = route_of("p", &["a", "b", "c"]).unwrap().advance();
        let mut m = Message::new("x");
        slip.write_onto(&mut m).unwrap();
        assert_eq!(
            m.engine_header(headers::ROUTE),
            Some(&HeaderValue::Text("a,b,c".into()))
        );
        assert_eq!(
            m.engine_header(headers::ROUTE_POSITION),
            Some(&HeaderValue::Int(1))
        );
        let read = slip_from(&m).unwrap().unwrap().resolved("p");
        assert_eq!(read.next().unwrap().routing_key, "b");
        assert_eq!(read.done().len(), 1);
        assert_eq!(read.route_id(), slip.route_id());
        // Past the end is finished; JSON wins when both are there.
        m.engine_headers
            .insert(headers::ROUTE_POSITION.into(), HeaderValue::Int(7));
        assert!(slip_from(&m).unwrap().unwrap().is_finished());
        m.headers.insert(
            headers::ROUTING_SLIP.into(),
            HeaderValue::Text(RoutingSlip::new().then("j", "k", "").to_json()),
        );
        assert_eq!(slip_from(&m).unwrap().unwrap().form(), SlipForm::Json);
    }

    #[test]
    fn hop_ids_are_stable_and_differ_per_position() {
        assert_eq!(hop_id("m", 1), hop_id("m", 1));
        assert_ne!(hop_id("m", 1), hop_id("m", 2));
        assert_eq!(hop_id("m", 1).len(), 36);
    }
}
