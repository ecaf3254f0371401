//! The JSON routing slip (`acemq-routing-slip`) and the declared route headers
//! (`x-acemq-route`, `-route-position`, `-route-id`): reading never panics, a slip read from
//! JSON writes back to JSON that reads as the same slip.
#![no_main]

use acemq_amqp::fuzzing::read_delivery;
use acemq_amqp::patterns::routing_slip::{slip_from, RoutingSlip};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(slip) = RoutingSlip::from_json(text) {
            let json = slip.to_json();
            let again = RoutingSlip::from_json(&json).expect("a slip we wrote reads back");
            assert_eq!(again.to_json(), json);
            let _ = slip.advance();
        }
    }
    if let Some(wire) = common::parse(data) {
        let m = read_delivery(wire.body.clone(), common::properties(&wire), "", &wire.routing_key);
        if let Ok(Some(slip)) = slip_from(&m) {
            let _ = slip.next();
            let advanced = slip.advance();
            let _ = advanced.is_finished();
        }
    }
});
