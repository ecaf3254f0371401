//! Sagas: a failure at each step position, compensation order, a failing compensation reported
//! unresolved while the others run, panicking steps and compensations. No broker involved.

use std::sync::Mutex;

use acemq_amqp::patterns::saga::Saga;

/// What ran, in order: `do:x`, `undo:x`.
#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Log {
    fn push(&self, s: String) {
        self.0.lock().unwrap().push(s);
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct Input {
    log: Log,
    /// The step that fails (by name), and how: "err" or "panic".
    fail: Option<(&'static str, &'static str)>,
    /// Compensations that fail (by name).
    undo_fails: Vec<&'static str>,
}

fn input(fail: Option<(&'static str, &'static str)>, undo_fails: &[&'static str]) -> Input {
    Input {
        log: Log::default(),
        fail,
        undo_fails: undo_fails.to_vec(),
    }
}

fn saga(steps: &[(&'static str, bool)]) -> Saga<Input> {
    let mut saga = Saga::new("order");
    for &(name, compensated) in steps {
        let action = move |i: &Input| -> Result<(), String> {
            match i.fail {
                Some((n, "panic")) if n == name => panic!("{name} blew up"),
                Some((n, _)) if n == name => Err(format!("{name} failed")),
                _ => {
                    i.log.push(format!("do:{name}"));
                    Ok(())
                }
            }
        };
        saga = if compensated {
            saga.step(name, action, move |i: &Input| -> Result<(), String> {
                i.log.push(format!("undo:{name}"));
                if i.undo_fails.contains(&name) {
                    if name == "panicky" {
                        panic!("the compensation of {name} panicked");
                    }
                    return Err(format!("cannot undo {name}"));
                }
                Ok(())
            })
        } else {
            saga.step_without_compensation(name, action)
        };
    }
    saga
}

#[test]
fn every_step_succeeding_compensates_nothing() {
    let s = saga(&[("a", true), ("b", true), ("c", true)]);
    let i = input(None, &[]);
    let r = s.run(&i);
    assert!(r.succeeded() && !r.has_unresolved());
    assert_eq!(r.completed(), ["a", "b", "c"]);
    assert!(r.compensated().is_empty() && r.failed().is_none());
    assert_eq!(i.log.take(), ["do:a", "do:b", "do:c"]);
}

#[test]
fn a_failure_at_each_position_compensates_the_completed_steps_in_reverse() {
    let names = ["a", "b", "c", "d"];
    let s = saga(&[("a", true), ("b", true), ("c", true), ("d", true)]);
    for (k, failing) in names.iter().enumerate() {
        let i = input(Some((failing, "err")), &[]);
        let r = s.run(&i);
        assert!(!r.succeeded());
        let failed = r.failed().unwrap();
        assert_eq!(failed.step, *failing);
        assert_eq!(failed.error.to_string(), format!("{failing} failed"));
        assert_eq!(r.completed(), &names[..k]);
        let reversed: Vec<&str> = names[..k].iter().rev().copied().collect();
        assert_eq!(r.compensated(), reversed.as_slice());
        let mut want: Vec<String> = names[..k].iter().map(|n| format!("do:{n}")).collect();
        want.extend(reversed.iter().map(|n| format!("undo:{n}")));
        assert_eq!(i.log.take(), want, "failing at {failing}");
        assert!(!r.has_unresolved());
    }
}

#[test]
fn a_failing_compensation_is_unresolved_and_the_others_still_run() {
    let s = saga(&[("a", true), ("b", true), ("c", true), ("d", true)]);
    let i = input(Some(("d", "err")), &["b"]);
    let r = s.run(&i);
    assert_eq!(
        i.log.take(),
        ["do:a", "do:b", "do:c", "undo:c", "undo:b", "undo:a"]
    );
    assert_eq!(r.compensated(), ["c", "a"]);
    assert!(r.has_unresolved());
    assert_eq!(r.unresolved().len(), 1);
    assert_eq!(r.unresolved()[0].step, "b");
    assert_eq!(r.unresolved()[0].error.to_string(), "cannot undo b");
    assert!(r.to_string().contains("unresolved [\"b\"]"), "{r}");
}

#[test]
fn a_completed_step_without_compensation_is_skipped() {
    let s = saga(&[("a", true), ("email", false), ("c", true)]);
    let i = input(Some(("c", "err")), &[]);
    let r = s.run(&i);
    assert_eq!(r.skipped(), ["email"]);
    assert_eq!(r.compensated(), ["a"]);
    assert_eq!(i.log.take(), ["do:a", "do:email", "undo:a"]);
}

#[test]
fn a_panicking_step_is_a_failure_not_a_crash() {
    let s = saga(&[("a", true), ("b", true), ("c", true)]);
    let i = input(Some(("b", "panic")), &[]);
    let r = s.run(&i);
    let failed = r.failed().unwrap();
    assert_eq!(failed.step, "b");
    assert_eq!(failed.error.to_string(), "panic: b blew up");
    assert_eq!(r.compensated(), ["a"]);
    assert_eq!(i.log.take(), ["do:a", "undo:a"]);
}

#[test]
fn a_panicking_compensation_is_unresolved_and_the_others_still_run() {
    let s = saga(&[("a", true), ("panicky", true), ("c", true)]);
    let i = input(Some(("c", "err")), &["panicky"]);
    let r = s.run(&i);
    assert_eq!(r.compensated(), ["a"]);
    assert_eq!(r.unresolved()[0].step, "panicky");
    assert!(r.unresolved()[0]
        .error
        .to_string()
        .starts_with("panic: the compensation of panicky panicked"));
    assert_eq!(
        i.log.take(),
        ["do:a", "do:panicky", "undo:panicky", "undo:a"]
    );
}

#[test]
fn a_saga_is_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    let s = saga(&[("a", true)]);
    assert_send_sync(&s);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| assert!(s.run(&input(None, &[])).succeeded()));
        }
    });
}
