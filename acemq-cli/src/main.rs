//! `acemq`: the operator's command line for acemq-amqp (replay, peek, outbox, schema,
//! topology). Built only on the library's public API. Exit codes: 0 ok, 1 partial or failed,
//! 2 usage, 3 cannot connect (broker or database).

mod db;
mod out;
mod outbox;
mod plan;
mod queues;
mod receipts;
mod topology;

use std::process::ExitCode;
use std::time::Duration;

use acemq_amqp::topology::ApplyMode;
use clap::{Args, Parser, Subcommand, ValueEnum};

use out::Out;

/// The local broker's guest account.
const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The environment variable `--url` falls back to.
const URL_ENV: &str = "ACEMQ_URL";

/// `--url`'s help: the default shown with its password masked (clap would print it whole).
fn url_help() -> String {
    format!(
        "The broker (`amqp://user:password@host:port/vhost` or `amqps://…`). The password is \
         never printed [env: {URL_ENV}] [default: {}]",
        out::mask_url(DEFAULT_URL)
    )
}

/// The operator's command line for acemq-amqp: replay dead letters, peek at a queue, look after
/// an outbox, print or apply the SQL schema, check the broker's topology.
///
/// The commands that talk to the broker (replay, peek, topology check) take `--url` (else
/// `ACEMQ_URL`, else the local guest account); the outbox and `schema create` take `--db` (else
/// `ACEMQ_DB`).
///
/// Exit codes: 0 ok; 1 partial or failed (a replay that stopped short, differences found, a
/// record not released); 2 usage (a bad argument, or a URL that is not `amqp://`/`amqps://`);
/// 3 cannot connect to the broker or the database.
#[derive(Parser, Debug)]
#[command(name = "acemq", version)]
struct Cli {
    /// `acemq --url URL peek …`, as it was written when `--url` was global: still read for the
    /// broker commands, refused for the others. Not shown: the commands show their own.
    #[arg(long, hide = true, value_name = "URL")]
    url: Option<String>,

    /// One JSON object per line on stdout, for scripts (errors too, usage errors included:
    /// `{"error": …, "kind": "usage", "exit": 2}`).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replays a dead-letter queue: moves its messages back to where they were going.
    Replay(ReplayArgs),
    /// Shows the first messages of a queue without consuming them (they go back unchanged, in
    /// order).
    Peek(PeekArgs),
    /// An outbox table: backlog, retired records, release.
    Outbox(OutboxArgs),
    /// The SQL schema of the stores (idempotency, outbox, schema registry).
    Schema(SchemaArgs),
    /// The broker topology the library declares.
    Topology(TopologyArgs),
    /// Idempotency receipts: delete those past a retention, never one a message still
    /// waiting on the broker could need.
    Receipts(ReceiptsArgs),
}

/// `--url`, on the commands that talk to the broker only.
#[derive(Args, Debug)]
struct BrokerArgs {
    #[arg(long, value_name = "URL", help = url_help())]
    url: Option<String>,
}

impl BrokerArgs {
    /// The broker URL: `--url` after the command, else `--url` before it, else `ACEMQ_URL`,
    /// else the local guest account.
    fn url(&self, before: Option<&str>) -> Result<String, Failure> {
        if let Some(url) = self.url.as_deref().or(before) {
            return Ok(url.to_string());
        }
        match std::env::var(URL_ENV) {
            Ok(url) => Ok(url),
            Err(std::env::VarError::NotPresent) => Ok(DEFAULT_URL.to_string()),
            Err(std::env::VarError::NotUnicode(_)) => Err(Failure {
                code: 2,
                message: format!("{URL_ENV} is not valid UTF-8"),
            }),
        }
    }
}

#[derive(Args, Debug)]
struct ReplayArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    /// The dead-letter queue (`orders.dlq`, `orders.parked`), or a work queue (`orders`) to
    /// replay its `.dlq`.
    queue: String,
    /// Publishes every message with this routing key (default: each one's own).
    #[arg(long, value_name = "K")]
    to_routing_key: Option<String>,
    /// Publishes every message to this exchange (`""` for the default exchange; default: the
    /// one each was first published to).
    #[arg(long, value_name = "E")]
    to_exchange: Option<String>,
    /// Stops after this many messages moved (or, with --dry-run, listed).
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Stops once this long has passed (`90s`, `5m`, `1h`, `250ms`; a bare number is seconds:
    /// `90` is `90s`).
    #[arg(long, value_name = "D", value_parser = parse_duration)]
    deadline: Option<Duration>,
    /// Moves only messages whose `x-acemq-error` contains this text.
    #[arg(long, value_name = "TEXT")]
    error_contains: Option<String>,
    /// Keeps attempt and error as they are (default: attempt back to 1, error cleared).
    #[arg(long)]
    no_restart: bool,
    /// Lists what would move (id, type, attempt, error, age) and leaves the queue exactly as
    /// it was.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug)]
struct PeekArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    /// The queue, as named (`orders.dlq`).
    queue: String,
    /// How many messages to show, from the head of the queue.
    #[arg(long, default_value_t = 10, value_name = "N")]
    limit: usize,
    /// Peeks a quorum queue too, accepting that the messages read go back behind the others
    /// and their x-delivery-count rises (a classic queue keeps its order without it).
    #[arg(long)]
    unordered: bool,
}

#[derive(Args, Debug)]
struct DbArgs {
    /// The database: `sqlite:PATH`, a PostgreSQL connection string (`postgres://…` or
    /// `host=… user=… dbname=…`) or a MySQL/MariaDB URL (`mysql://user:password@host:port/db`);
    /// default `ACEMQ_DB`. The password is never printed.
    #[arg(
        long,
        global = true,
        env = "ACEMQ_DB",
        hide_env_values = true,
        value_name = "URL"
    )]
    db: Option<String>,
}

impl DbArgs {
    /// The database URL, or a usage error (exit 2).
    fn url(&self) -> Result<&str, Failure> {
        self.db.as_deref().ok_or_else(|| Failure {
            code: 2,
            message: "no database: give --db URL (sqlite:PATH, a PostgreSQL connection \
                      string or a mysql:// URL) or set ACEMQ_DB"
                .into(),
        })
    }
}

#[derive(Args, Debug)]
struct OutboxArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The outbox table.
    #[arg(long, default_value = "acemq_outbox", global = true)]
    table: String,
    /// Failed attempts after which a record is retired (as the relay's store is configured).
    #[arg(long, default_value_t = 10, global = true)]
    max_attempts: u32,
    #[command(subcommand)]
    command: OutboxCommand,
}

#[derive(Subcommand, Debug)]
enum OutboxCommand {
    /// Pending records, the oldest one's age (the lag), retired records.
    Status,
    /// Retired records (reached the attempts limit) with their last error.
    Retired,
    /// Resets a retired record's attempts so the relay picks it up again.
    Release {
        /// The record's id.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<i64>,
        /// Releases every retired record.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Args, Debug)]
struct SchemaArgs {
    #[command(subcommand)]
    command: SchemaCommand,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DialectArg {
    Sqlite,
    Postgres,
    /// MySQL 8.0+ or MariaDB 10.6+.
    Mysql,
}

#[derive(Subcommand, Debug)]
enum SchemaCommand {
    /// Prints the DDL of every table.
    Ddl {
        /// Which database's DDL.
        #[arg(long, value_enum)]
        dialect: DialectArg,
    },
    /// Creates every table (and index) that does not exist yet.
    Create {
        #[command(flatten)]
        db: DbArgs,
    },
}

#[derive(Args, Debug)]
struct ReceiptsArgs {
    #[command(subcommand)]
    command: ReceiptsCommand,
}

#[derive(Subcommand, Debug)]
enum ReceiptsCommand {
    /// Deletes receipts confirmed longer than --older-than ago — but none younger than the
    /// oldest message still waiting in a --queue (with its .dlq, .parked and --rung queues) or
    /// the scheduler's ladder (--schedule), read first without consuming anything; says which
    /// message held the cutoff back. Exit 0; 1 when the horizon cannot be known (nothing
    /// deleted).
    Purge {
        #[command(flatten)]
        broker: BrokerArgs,
        #[command(flatten)]
        db: DbArgs,
        /// How old a receipt may be deleted at (`7d`, `12h`; a bare number is seconds).
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        older_than: Duration,
        /// A consumed queue whose consumer keeps its receipts in the table (repeatable).
        #[arg(long, value_name = "Q", required = true)]
        queue: Vec<String>,
        /// A broker retry rung of those queues (repeatable).
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        rung: Vec<Duration>,
        /// Also scans the scheduler's ladder (acemq.schedule).
        #[arg(long)]
        schedule: bool,
        /// The idempotency table.
        #[arg(long, default_value = "acemq_idempotency")]
        table: String,
        /// Also deletes retired records of this outbox table older than the cutoff.
        #[arg(long, value_name = "TABLE")]
        retired_outbox: Option<String>,
        /// The most messages one queue may hold for its scan.
        #[arg(long, default_value_t = 10_000)]
        scan_limit: usize,
    },
}

#[derive(Args, Debug)]
struct TopologyArgs {
    #[command(subcommand)]
    command: TopologyCommand,
}

#[derive(Subcommand, Debug)]
enum TopologyCommand {
    /// Prints the scheduler topology (exchange, rungs, control queue, bindings).
    Schedule,
    /// Compares the broker with a consumed queue (--queue: the queue is there, and its failure
    /// topology `.dlq`, `.parked`, retry rungs) or the scheduler topology (--schedule), argument
    /// by argument. Changes nothing.
    Check {
        #[command(flatten)]
        broker: BrokerArgs,
        /// A consumed queue whose failure topology to check (repeatable).
        #[arg(long, value_name = "Q")]
        queue: Vec<String>,
        /// A broker retry rung of those queues (`40s`, `5m`; a bare number is seconds: `40` is
        /// `40s`; repeatable): the consumer policy's broker rungs.
        #[arg(long, value_name = "D", value_parser = parse_duration)]
        rung: Vec<Duration>,
        /// Checks the scheduler topology (alone, or with --queue).
        #[arg(long)]
        schedule: bool,
    },
    /// What the topology in FILE (TOML or JSON: docs/topology.md) would create on the broker,
    /// what is there and what differs, argument by argument. Changes nothing. Exit 0.
    Plan {
        #[command(flatten)]
        broker: BrokerArgs,
        /// The topology file: `.toml`, else JSON.
        #[arg(long, value_name = "FILE")]
        file: std::path::PathBuf,
    },
    /// Creates what the topology in FILE is missing and binds its bindings; refuses, creating
    /// nothing, when a queue or exchange differs (exit 1, naming each difference).
    Apply {
        #[command(flatten)]
        broker: BrokerArgs,
        /// The topology file: `.toml`, else JSON.
        #[arg(long, value_name = "FILE")]
        file: std::path::PathBuf,
    },
    /// Fails (exit 1) when anything in FILE is missing or differs on the broker. Changes
    /// nothing.
    Validate {
        #[command(flatten)]
        broker: BrokerArgs,
        /// The topology file: `.toml`, else JSON.
        #[arg(long, value_name = "FILE")]
        file: std::path::PathBuf,
    },
}

/// A failure the CLI reports: its exit code and one line.
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// Exit 1: failed or partial.
    pub fn failed(message: impl Into<String>) -> Failure {
        Failure {
            code: 1,
            message: message.into(),
        }
    }

    /// Exit 3: cannot connect.
    pub fn connect(message: impl Into<String>) -> Failure {
        Failure {
            code: 3,
            message: message.into(),
        }
    }

    /// A library error: exit 3 when it is about reaching the broker or database, else 1.
    pub fn from_error(what: &str, e: acemq_amqp::Error) -> Failure {
        let code = match &e {
            acemq_amqp::Error::Connect { .. } | acemq_amqp::Error::ConnectionLost { .. } => 3,
            _ => 1,
        };
        Failure {
            code,
            message: format!("{what}: {e}"),
        }
    }
}

/// What a command returns: Ok(exit code) after printing its output.
pub type Outcome = Result<u8, Failure>;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let mut out = Out::new(cli.json);
    let result = run(&cli, &mut out);
    let code = match result {
        Ok(code) => code,
        Err(f) => {
            out.error(&f.message, f.code);
            f.code
        }
    };
    ExitCode::from(code)
}

/// A usage error found by clap: its text for people, or with `--json` anywhere in the
/// arguments one JSON object (`kind` `usage`) on stdout too, as every other error. Exit 2.
/// Help and version print as clap prints them (exit 0).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let json = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    if !json || matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let message = if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        "no command given (acemq --help lists them)".to_string()
    } else {
        usage_message(&e.render().to_string())
    };
    Out::new(true).error(&message, 2);
    ExitCode::from(2)
}

/// clap's rendered error as one line: `error: …` and then its usage line, without the
/// `--help` hint.
fn usage_message(rendered: &str) -> String {
    let mut error = Vec::new();
    let mut usage = None;
    for line in rendered.lines().map(str::trim) {
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(u);
        } else if !line.is_empty() && !line.starts_with("For more information") {
            error.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    let error = error.join(" ");
    match usage {
        Some(u) => format!("{error} (usage: {u})"),
        None => error,
    }
}

fn run(cli: &Cli, out: &mut Out) -> Outcome {
    let before = cli.url.as_deref();
    // `--url` before a command that does not talk to the broker: refused, as it is after one.
    let no_broker = |command: &str, instead: &str| -> Result<(), Failure> {
        match before {
            Some(_) => Err(Failure {
                code: 2,
                message: format!(
                    "--url names the broker, and `acemq {command}` does not talk to the \
                     broker{instead}: leave --url out"
                ),
            }),
            None => Ok(()),
        }
    };
    match &cli.command {
        Command::Replay(a) => queues::replay(&a.broker.url(before)?, a, out),
        Command::Peek(a) => queues::peek(&a.broker.url(before)?, a, out),
        Command::Outbox(a) => {
            no_broker("outbox", " (its database is --db)")?;
            outbox::run(a.db.url()?, a, out)
        }
        Command::Schema(a) => match &a.command {
            SchemaCommand::Ddl { dialect } => {
                no_broker("schema ddl", "")?;
                db::ddl(*dialect, out)
            }
            SchemaCommand::Create { db } => {
                no_broker("schema create", " (its database is --db)")?;
                db::create(db.url()?, out)
            }
        },
        Command::Receipts(a) => match &a.command {
            ReceiptsCommand::Purge {
                broker,
                db,
                older_than,
                queue,
                rung,
                schedule,
                table,
                retired_outbox,
                scan_limit,
            } => receipts::purge(
                &broker.url(before)?,
                db.url()?,
                &receipts::Purge {
                    older_than: *older_than,
                    queues: queue,
                    rungs: rung,
                    schedule: *schedule,
                    table,
                    retired_outbox: retired_outbox.as_deref(),
                    scan_limit: *scan_limit,
                },
                out,
            ),
        },
        Command::Topology(a) => match &a.command {
            TopologyCommand::Schedule => {
                no_broker(
                    "topology schedule",
                    " (it prints what the library declares)",
                )?;
                topology::schedule(out)
            }
            TopologyCommand::Check {
                broker,
                queue,
                rung,
                schedule,
            } => topology::check(&broker.url(before)?, queue, rung, *schedule, out),
            TopologyCommand::Plan { broker, file } => {
                plan::run(&broker.url(before)?, file, ApplyMode::Plan, out)
            }
            TopologyCommand::Apply { broker, file } => {
                plan::run(&broker.url(before)?, file, ApplyMode::Apply, out)
            }
            TopologyCommand::Validate { broker, file } => {
                plan::run(&broker.url(before)?, file, ApplyMode::Validate, out)
            }
        },
    }
}

/// `90s`, `5m`, `1h`, `2d`, `250ms`, or a bare number of seconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number.parse().map_err(|_| {
        format!("{text:?} is not a duration (write 90s, 5m, 1h, 250ms, or 90 for seconds)")
    })?;
    let d = match unit {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        "d" => Duration::from_secs(n.saturating_mul(86_400)),
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m, h, d)")),
    };
    Ok(d)
}

/// Opens the broker connection: exit 2 for a URL that is not an AMQP URL (`memory://`, the
/// library's in-process broker, included), exit 3 with one line (the URL's password masked)
/// when the broker cannot be reached.
pub fn connect(url: &str) -> Result<acemq_amqp::Connection, Failure> {
    let shown = out::mask_url(url);
    let not_amqp = |why: &str| Failure {
        code: 2,
        message: format!(
            "the broker URL {shown} (--url or {URL_ENV}) is not an AMQP URL: {why}; give \
             amqp://host:port/vhost or amqps://host:port/vhost, user:password@ before the host"
        ),
    };
    if url.starts_with("memory://") {
        // The library takes it (feature `memory`), but a broker inside this process is an
        // empty one of its own: nothing an operator could look at or repair.
        return Err(not_amqp(
            "memory:// is the library's in-process broker, which lives inside the application \
             that opened it; acemq would get an empty one of its own",
        ));
    }
    if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
        // Not the library's message, which offers memory:// too.
        return Err(not_amqp("it must start with amqp:// or amqps://"));
    }
    if let Err(e) = acemq_amqp::Address::parse(url) {
        return Err(not_amqp(&match e {
            acemq_amqp::Error::InvalidArgument { reason } => reason
                .strip_prefix("bad AMQP URL: ")
                .unwrap_or(&reason)
                .to_string(),
            other => other.to_string(),
        }));
    }
    acemq_amqp::Connection::open_with(
        acemq_amqp::ConnectionOptions::new()
            .address(url)
            .name("acemq-cli")
            .connect_timeout(Duration::from_secs(10)),
    )
    .map_err(|e| match e {
        // The CLI's own options are valid: what the library refuses is the URL.
        acemq_amqp::Error::InvalidArgument { reason } => not_amqp(&reason),
        acemq_amqp::Error::Connect { source, .. } => {
            Failure::connect(format!("cannot connect to the broker at {shown}: {source}"))
        }
        other => Failure::connect(format!("cannot connect to the broker at {shown}: {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("m").is_err());
    }

    #[test]
    fn usage_errors_are_one_line() {
        assert_eq!(
            usage_message(
                "error: unexpected argument 'x' found\n\nUsage: acemq peek <QUEUE>\n\n\
                 For more information, try '--help'.\n"
            ),
            "unexpected argument 'x' found (usage: acemq peek <QUEUE>)"
        );
    }

    #[test]
    fn the_arguments_hold_together() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
