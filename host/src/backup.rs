//! `orl backup`: an online copy of the embedded SQLite database, taken with `VACUUM INTO`
//! while the server keeps running. PostgreSQL databases are backed up with `pg_dump`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use sqlx::ConnectOptions as _;
use sqlx::sqlite::SqliteConnectOptions;

use crate::store::{self, Store};

/// Options of `orl backup`.
#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// The file to write the copy to. It must not exist: a backup never overwrites a file.
    pub path: PathBuf,
    /// The server's data directory; the database copied is `<data-dir>/orl.db`.
    #[arg(long, default_value = "./orl-data")]
    pub data_dir: PathBuf,
    /// The server's database URL, when it is not the SQLite file in the data directory
    /// (a `sqlite://…` URL). A `postgres://…` URL is refused: use `pg_dump`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
}

/// Copies the database `orl serve` with the same `--data-dir` / `--database-url` uses to
/// `args.path`, as one consistent snapshot, while the server may be writing to it.
pub async fn run(args: BackupArgs) -> anyhow::Result<()> {
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| Store::sqlite_url(&args.data_dir));
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        bail!(
            "the database is PostgreSQL: orl backup copies only the embedded SQLite database. \
             Back PostgreSQL up with pg_dump, e.g. `pg_dump --format=custom --file=orl.dump \"$DATABASE_URL\"`, \
             and restore it with pg_restore"
        );
    }
    let Some((source, _)) = store::sqlite_file(&url) else {
        bail!(
            "{url:?} is not the URL of a SQLite database file: use sqlite://<path> or --data-dir"
        );
    };
    if !source.is_file() {
        bail!(
            "no database at {} (point --data-dir or --database-url at the server's)",
            source.display()
        );
    }
    let size = copy(&source, &args.path).await?;
    println!(
        "backed up {} to {} ({size} bytes)",
        source.display(),
        args.path.display()
    );
    Ok(())
}

/// Writes a snapshot of the SQLite database at `source` to the new file `target`, readable
/// by its owner only, and answers its size. On failure nothing is left at `target`.
pub async fn copy(source: &Path, target: &Path) -> anyhow::Result<u64> {
    // Created here, empty and private, so an existing file is refused atomically and the
    // copy (which holds key hashes) is never readable by others; VACUUM INTO fills an
    // empty file.
    create_private_new(target)?;
    match vacuum_into(source, target).await {
        Ok(size) => Ok(size),
        Err(err) => {
            let _ = std::fs::remove_file(target);
            Err(err)
        }
    }
}

fn create_private_new(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "{} already exists: a backup is written to a new file only",
            path.display()
        ),
        Err(err) => Err(err).with_context(|| format!("creating {}", path.display())),
    }
}

async fn vacuum_into(source: &Path, target: &Path) -> anyhow::Result<u64> {
    // Opened as the server opens it, without creating anything; a reader of a WAL
    // database neither blocks the server's writer nor waits for it.
    let mut conn = SqliteConnectOptions::new()
        .filename(source)
        .create_if_missing(false)
        .busy_timeout(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("opening {}", source.display()))?;
    let target_text = target
        .to_str()
        .with_context(|| format!("{} is not UTF-8", target.display()))?;
    sqlx::query("VACUUM INTO $1")
        .bind(target_text)
        .execute(&mut conn)
        .await
        .with_context(|| format!("copying {} to {}", source.display(), target.display()))?;
    sqlx::Connection::close(conn).await?;

    let mut check = SqliteConnectOptions::new()
        .filename(target)
        .create_if_missing(false)
        .read_only(true)
        .connect()
        .await
        .with_context(|| format!("opening the copy {}", target.display()))?;
    let verdict: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut check)
        .await?;
    sqlx::Connection::close(check).await?;
    if verdict != "ok" {
        bail!(
            "the copy {} failed SQLite's integrity check: {verdict}",
            target.display()
        );
    }

    // VACUUM INTO does not flush the copy to disk; a backup must survive a crash.
    let file = std::fs::File::open(target)?;
    file.sync_all()?;
    if let Some(dir) = target.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    }) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(file.metadata()?.len())
}
