//! A saga: reserve stock, charge the card, book the courier. For the second order the courier
//! is fully booked, so its completed steps are compensated in reverse order (refund, then
//! release). The report says what happened; nothing here needs a broker.
//! Run: `cargo run --example intermediate_saga`.

use acemq_amqp::patterns::saga::Saga;

type Step = std::result::Result<(), String>;

fn main() {
    let saga = Saga::new("place-order")
        .step(
            "reserve-stock",
            |order: &&str| -> Step {
                println!("  reserved stock for {order}");
                Ok(())
            },
            |order: &&str| -> Step {
                println!("  released the stock of {order}");
                Ok(())
            },
        )
        .step(
            "charge-card",
            |order: &&str| -> Step {
                println!("  charged the card for {order}");
                Ok(())
            },
            |order: &&str| -> Step {
                println!("  refunded the card for {order}");
                Ok(())
            },
        )
        .step_without_compensation("book-courier", |order: &&str| -> Step {
            if *order == "o-2" {
                return Err(format!("no courier free today for {order}"));
            }
            println!("  booked a courier for {order}");
            Ok(())
        });
    for order in ["o-1", "o-2"] {
        println!("order {order}:");
        let report = saga.run(&order);
        println!("{report}");
        println!(
            "succeeded: {}, completed {:?}, compensated {:?}, unresolved: {}",
            report.succeeded(),
            report.completed(),
            report.compensated(),
            report.has_unresolved()
        );
    }
}
