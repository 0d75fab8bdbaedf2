//! `herald bench webhooks`: events delivered a second to a fast local
//! receiver, and the delivery engine's send rate with no subscription and
//! with one whose receiver answers slowly (it must not drop: webhooks are
//! sent apart from the engine).

use super::ScratchDb;
use crate::settings::WebhookSettings;
use crate::store::SqlStore;
use crate::webhooks::Sender;
use actix_web::{web, App, HttpResponse, HttpServer};
use chrono::Utc;
use herald_actors::domain::{webhook_type_names, NewEvent, NewWebhook, RunId};
use herald_actors::ports::*;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A receiver on loopback that answers every request 204 after `delay`,
/// keeping connections alive; counts what it answered. An actix-web server
/// in a thread of its own (the daemon's HTTP stack, not one parsed by
/// hand), left running until the process ends, as the benchmark's
/// receivers always were.
fn receiver(delay: Duration) -> anyhow::Result<(u16, Arc<AtomicU64>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let count = Arc::new(AtomicU64::new(0));
    let seen = count.clone();
    // An actix server is not Send: it is built in the thread that runs it,
    // which says whether it could listen.
    let (started, listening) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let server = HttpServer::new(move || {
            let seen = seen.clone();
            App::new().default_service(web::to(move |_body: web::Bytes| {
                let seen = seen.clone();
                async move {
                    tokio::time::sleep(delay).await;
                    seen.fetch_add(1, Ordering::Relaxed);
                    HttpResponse::NoContent().finish()
                }
            }))
        })
        .workers(2)
        .listen(listener);
        match server {
            Ok(server) => {
                let _ = started.send(Ok(()));
                let _ = actix_rt::System::new().block_on(async move { server.run().await });
            }
            Err(e) => {
                let _ = started.send(Err(e));
            }
        }
    });
    listening
        .recv()
        .map_err(|_| anyhow::anyhow!("the bench receiver's thread ended"))??;
    Ok((port, count))
}

fn settings() -> WebhookSettings {
    WebhookSettings {
        allow_private: true,
        timeout_secs: 10,
        max_in_flight: 16,
        poll_ms: 20,
        disable_after_hours: 120,
        retry_scale: 1.0,
        proxy: Default::default(),
    }
}

async fn subscribe(store: &SqlStore, port: u16) -> anyhow::Result<i64> {
    Ok(store
        .create_webhook(&NewWebhook {
            url: format!("http://127.0.0.1:{port}/bench"),
            types: webhook_type_names()
                .iter()
                .map(|t| (*t).to_owned())
                .collect(),
            description: "bench".into(),
            enabled: true,
            secret: crate::webhooks::new_secret(),
            created_at: Utc::now(),
        })
        .await?
        .id)
}

/// Engine messages a second on a fresh database, with a subscription to a
/// receiver answering after `delay` when given.
async fn engine_rate(
    db: &str,
    accounts: usize,
    groups: usize,
    delay: Option<Duration>,
) -> anyhow::Result<f64> {
    let scratch = ScratchDb::create(db).await?;
    let store = Arc::new(
        SqlStore::connect(&scratch.url)
            .await?
            .with_secret_key(&bench_key()),
    );
    let sender = match delay {
        Some(delay) => {
            let (port, _) = receiver(delay)?;
            subscribe(&store, port).await?;
            Some(Sender::new(store.clone(), settings(), "bench")?.spawn())
        }
        None => None,
    };
    let result = super::engine::drive_on(store.clone(), accounts, groups, 3).await;
    if let Some(s) = sender {
        s.abort();
    }
    drop(store);
    scratch.cleanup().await?;
    let (messages, secs) = result?;
    Ok(messages as f64 / secs.max(1e-9))
}

/// The key the bench's webhook secrets are sealed under (a scratch
/// database's, never written to disk).
fn bench_key() -> crate::seal::SessionKey {
    crate::seal::SessionKey::from_bytes(rand::random(), "(bench)")
}

pub async fn run(
    db: &str,
    events: usize,
    accounts: usize,
    groups: usize,
) -> anyhow::Result<String> {
    // Delivered a second: `events` events, each to one fast receiver.
    let scratch = ScratchDb::create(db).await?;
    let store = Arc::new(
        SqlStore::connect(&scratch.url)
            .await?
            .with_secret_key(&bench_key()),
    );
    let (port, received) = receiver(Duration::ZERO)?;
    subscribe(&store, port).await?;
    let now = Utc::now();
    let batch: Vec<NewEvent> = (0..events)
        .map(|i| NewEvent {
            at: now,
            kind: "run_finished",
            account_id: None,
            run_id: Some(RunId(i as i64 + 1)),
            data: serde_json::json!({"status": "success", "delivered": "1 of 1 delivered"}),
        })
        .collect();
    for chunk in batch.chunks(1000) {
        store.append_events(chunk).await?;
    }
    let started = Instant::now();
    let sender = Sender::new(store.clone(), settings(), "bench")?.spawn();
    while received.load(Ordering::Relaxed) < events as u64 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "only {} of {events} delivered in 10 minutes",
            received.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    sender.abort();
    let backend = store.backend();
    drop(store);
    scratch.cleanup().await?;

    let plain = engine_rate(db, accounts, groups, None).await?;
    let slow = engine_rate(db, accounts, groups, Some(Duration::from_secs(2))).await?;
    Ok(format!(
        "webhooks: backend={backend} events={events} seconds={secs:.3} delivered_per_s={:.0} \
         engine_msgs_per_s={plain:.0} engine_msgs_per_s_slow_receiver={slow:.0} ratio={:.3}",
        events as f64 / secs.max(1e-9),
        slow / plain.max(1e-9)
    ))
}
