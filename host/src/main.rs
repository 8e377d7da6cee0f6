//! `orl`: the server (`orl serve`) and the command-line client in one binary.

use clap::{CommandFactory as _, Parser, Subcommand};
use orl::backup::{self, BackupArgs};
use orl::cli::{self, ClientCommand, Connection};
use orl::serve::{self, ServeArgs};

/// The server allocates many small, short-lived buffers per request on every thread;
/// mimalloc's per-thread heaps serve them with less CPU than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "orl",
    version,
    about = "GPU capacity platform whose policies are WebAssembly"
)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the largest command does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Copy the server's SQLite database to a new file while the server runs.
    Backup(BackupArgs),
    /// Print a completion script for a shell, e.g. `orl completions bash > /etc/bash_completion.d/orl`.
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Measure the policy runtime.
    #[command(subcommand)]
    Bench(BenchCommand),
    #[command(flatten)]
    Client(ClientCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The default placement policy, native vs as a WebAssembly component.
    Placement(orl::bench::PlacementBench),
    /// Creates over HTTP against a real `orl serve`, at fleet sizes.
    Api(orl::bench::api::ApiBench),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => {
            serve::init_logs(args.log_format);
            serve::run(args).await
        }
        Command::Backup(args) => backup::run(args).await,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "orl", &mut std::io::stdout());
            Ok(())
        }
        // The bench drives each plugin call to completion on its own thread, timing it
        // alone: never on an async task.
        Command::Bench(BenchCommand::Placement(args)) => {
            match tokio::task::spawn_blocking(move || orl::bench::run(args)).await {
                Ok(result) => result,
                Err(err) => Err(anyhow::anyhow!("the placement bench stopped: {err}")),
            }
        }
        Command::Bench(BenchCommand::Api(args)) => orl::bench::api::run(args).await,
        Command::Client(command) => cli::run(cli.connection, command).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("orl: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
