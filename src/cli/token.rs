//! The admin tokens of the embedded backend from the command line: `harvester-cloud token
//! create|list|revoke` (on the data directory, also while `serve` runs), and the first admin token a
//! fresh data directory gets on its first start. Secrets are printed to stdout only, never logged.

use std::{io::IsTerminal, path::Path};

use sqlx::SqlitePool;
use time::{OffsetDateTime, format_description::well_known::Rfc3339};
use tracing::info;

use crate::auth::{
    ApiToken,
    tokens::{self, TokenStoreError},
};
use crate::{
    certs::{self, CertError},
    config::TokenCommand,
    store::embedded::{self, OpenError},
};

/// The file, in the data directory, that the first admin token is written to.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// A token command failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenCommandError {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("--ttl is too long")]
    Ttl(#[source] time::error::ConversionRange),
    #[error("invalid --ttl: {0}")]
    TtlRange(String),
    #[error(transparent)]
    Store(#[from] TokenStoreError),
    #[error(transparent)]
    Write(#[from] CertError),
}

/// The longest `--ttl`: a hundred years (a longer one overflows dates; use no --ttl for "never").
const MAX_TTL: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

/// Runs a `token` command on the database of `data_dir`.
pub async fn run(data_dir: &Path, command: TokenCommand) -> Result<(), TokenCommandError> {
    let changes = matches!(
        command,
        TokenCommand::Create { .. } | TokenCommand::Revoke { .. }
    );
    let pool = embedded::open_pool(data_dir).await?;
    let result = command_on(&pool, command).await;
    pool.close().await;
    if changes && result.is_ok() {
        // A running server reads the token table again at once.
        tokens::mark_changed(data_dir);
    }
    result
}

async fn command_on(pool: &SqlitePool, command: TokenCommand) -> Result<(), TokenCommandError> {
    match command {
        TokenCommand::Create { ttl, description } => {
            let ttl = ttl
                .map(|d| {
                    if d.is_zero() {
                        return Err(TokenCommandError::TtlRange(
                            "a token must live longer than zero".into(),
                        ));
                    }
                    if d > MAX_TTL {
                        return Err(TokenCommandError::TtlRange(format!(
                            "at most {} days",
                            MAX_TTL.as_secs() / 86_400
                        )));
                    }
                    time::Duration::try_from(d).map_err(TokenCommandError::Ttl)
                })
                .transpose()?;
            let (token, rec) = tokens::create(pool, &description, ttl).await?;
            match rec.expires_at {
                Some(at) => eprintln!("created {} (expires {at})", rec.name),
                None => eprintln!("created {} (does not expire)", rec.name),
            }
            println!("{}", token.expose());
        }
        TokenCommand::List => {
            let now = OffsetDateTime::now_utc();
            println!(
                "{:<12} {:<8} {:<21} {:<21} DESCRIPTION",
                "NAME", "STATUS", "CREATED", "EXPIRES"
            );
            let fmt = |t: OffsetDateTime| t.format(&Rfc3339).unwrap_or_default();
            for t in tokens::list(pool).await? {
                println!(
                    "{:<12} {:<8} {:<21} {:<21} {}",
                    t.name,
                    t.status(now),
                    fmt(t.created_at),
                    t.expires_at.map(fmt).unwrap_or_else(|| "never".into()),
                    t.description
                );
            }
        }
        TokenCommand::Revoke { name } => {
            let rec = tokens::revoke(pool, &name).await?;
            println!("{} revoked", rec.name);
        }
    }
    Ok(())
}

/// On first start (no token at all) creates an admin token and writes it to
/// `<data-dir>/admin-token`; `None` when the data directory has tokens already.
pub async fn ensure_admin_token(
    pool: &SqlitePool,
    data_dir: &Path,
) -> Result<Option<ApiToken>, TokenCommandError> {
    if tokens::count(pool).await? > 0 {
        return Ok(None);
    }
    let (token, rec) = tokens::create(pool, "created on first start", None).await?;
    let path = data_dir.join(ADMIN_TOKEN_FILE);
    certs::write_private(&path, format!("{}\n", token.expose()).as_bytes())?;
    info!(token = %rec.name, path = %path.display(), "created the first admin token");
    // The secret goes to an interactive terminal only, never into logs.
    if std::io::stdout().is_terminal() {
        println!(
            "Admin token (shown once; also in {}):\n{}",
            path.display(),
            token.expose()
        );
    }
    Ok(Some(token))
}
