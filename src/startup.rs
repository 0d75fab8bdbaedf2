//! Builds the whole daemon — store, actors, control port — as one
//! `Application` that `main` and the tests start the same way.

use crate::http;
use crate::settings::Settings;
use crate::store::SqlStore;
use actix_web::dev::{Server, ServerHandle};
use anyhow::Context;
use herald_actors::ports::Store;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Arc<dyn Store>,
    pub ready: Arc<AtomicBool>,
}

pub struct Application {
    port: u16,
    server: Server,
    handle: ServerHandle,
    state: AppState,
}

impl Application {
    /// Opens (and migrates) the database, starts the actors and binds the
    /// control port. Port 0 picks a free port (tests).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&settings.storage.data_dir).with_context(|| {
            format!("creating data dir {}", settings.storage.data_dir.display())
        })?;
        let store: Arc<dyn Store> = Arc::new(
            SqlStore::connect(&settings.database_url())
                .await
                .context("opening the database")?,
        );
        let addr = settings.listen_addr()?;
        let listener =
            TcpListener::bind(addr).with_context(|| format!("binding control port {addr}"))?;
        let port = listener.local_addr()?.port();
        let state = AppState {
            settings: Arc::new(settings),
            store,
            ready: Arc::new(AtomicBool::new(false)),
        };
        let server = http::server(state.clone(), listener)?;
        let handle = server.handle();
        tracing::info!(%addr, port, backend = state.store.backend(), "control port bound");
        Ok(Self {
            port,
            server,
            handle,
            state,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until SIGTERM or SIGINT, then drains and returns.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Self {
            server,
            handle,
            state,
            ..
        } = self;
        let server = tokio::spawn(server);
        state.ready.store(true, Ordering::SeqCst);
        notify_systemd_ready();
        shutdown_signal().await;
        tracing::info!("shutdown requested: draining");
        state.ready.store(false, Ordering::SeqCst);
        handle.stop(true).await;
        server.await.context("control port task")??;
        tracing::info!("stopped cleanly");
        Ok(())
    }
}

fn notify_systemd_ready() {
    // Outside systemd NOTIFY_SOCKET is unset and this does nothing.
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "could not notify systemd");
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
