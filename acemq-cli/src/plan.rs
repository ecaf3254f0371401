//! `acemq topology plan|apply|validate --file FILE`: the library's `Topology` read from a file
//! and planned, applied or validated against the broker.

use std::path::Path;

use acemq_amqp::topology::{ApplyMode, PlanAction, Topology, TopologyPlan};
use serde_json::json;

use crate::out::Out;
use crate::{connect, Failure, Outcome};

fn report(plan: &TopologyPlan, out: &mut Out) {
    for item in &plan.items {
        let action = match &item.action {
            PlanAction::Create => json!("create"),
            PlanAction::Present => json!("present"),
            PlanAction::Bind => json!("bind"),
            PlanAction::Differs(d) => json!({ "differs": d.iter().map(|d| json!({
                "what": d.what, "broker": d.actual, "topology": d.expected })).collect::<Vec<_>>() }),
        };
        out.record(json!({ "kind": item.kind, "name": item.name, "action": action }));
    }
    out.text(plan.to_string());
}

pub fn run(url: &str, file: &Path, mode: ApplyMode, out: &mut Out) -> Outcome {
    let topology = Topology::from_file(file).map_err(|e| Failure {
        code: 2,
        message: e.to_string(),
    })?;
    let connection = connect(url)?;
    // Planned once: the plan is shown whatever comes of it (a refusal or a drift included).
    let result = topology.plan(&connection).and_then(|plan| {
        report(&plan, out);
        topology.apply_plan(&connection, &plan, mode).map(|()| plan)
    });
    let _ = connection.close();
    match result {
        Ok(plan) => {
            let done = match mode {
                ApplyMode::Plan => "planned: nothing changed".to_string(),
                ApplyMode::Apply => format!("applied: created {}", plan.to_create().count()),
                ApplyMode::Validate => "valid: the broker has the topology".to_string(),
            };
            out.text(done.clone());
            out.record(json!({ "ok": done }));
            Ok(0)
        }
        Err(e @ acemq_amqp::Error::TopologyConflict { .. }) => Err(Failure {
            code: 1,
            message: e.to_string(),
        }),
        Err(e) => Err(Failure::from_error("planning the topology", e)),
    }
}
