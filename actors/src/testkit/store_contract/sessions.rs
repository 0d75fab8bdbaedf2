//! Console sessions: kept until they expire, capped, ended on sign-out.

use super::fixtures::{at, S};
use crate::domain::*;

fn session(n: u32, expires_at: chrono::DateTime<chrono::Utc>) -> ConsoleSession {
    ConsoleSession {
        id_hash: format!("{n:064x}"),
        csrf: format!("csrf-{n}"),
        expires_at,
        user_id: None,
        user_name: "control.token".into(),
        role: Role::Admin,
        token_mark: Some(format!("mark-{n}")),
    }
}

pub async fn console_sessions_live_until_they_expire(s: S) {
    let a = session(1, at(100));
    assert_eq!(
        s.get_console_session(&a.id_hash, at(0)).await.unwrap(),
        None
    );
    s.put_console_session(&a, at(0), 10).await.unwrap();
    assert_eq!(
        s.get_console_session(&a.id_hash, at(99)).await.unwrap(),
        Some(a.clone()),
        "live before its end"
    );
    assert_eq!(
        s.get_console_session(&a.id_hash, at(100)).await.unwrap(),
        None,
        "over at its end"
    );
    assert_eq!(
        s.get_console_session(&session(2, at(100)).id_hash, at(0))
            .await
            .unwrap(),
        None,
        "another id opens nothing"
    );
    let b = session(2, at(200));
    s.put_console_session(&b, at(1), 10).await.unwrap();
    s.delete_console_session(&a.id_hash).await.unwrap();
    assert_eq!(
        s.get_console_session(&a.id_hash, at(2)).await.unwrap(),
        None
    );
    assert_eq!(
        s.get_console_session(&b.id_hash, at(2)).await.unwrap(),
        Some(b.clone()),
        "signing one out leaves the others"
    );
    // Ending a session that is gone already is no error.
    s.delete_console_session(&a.id_hash).await.unwrap();
}

fn a_mark(n: u32) -> ConsoleSession {
    session(n, at(0))
}

pub async fn console_sessions_past_the_cap_end_the_soonest_first(s: S) {
    // Another user's session, ending sooner than all: the cap is per user,
    // so nobody else's sign-ins end it.
    let mut ana = session(50, at(99));
    ana.user_name = "ana".into();
    ana.user_id = Some(4);
    ana.role = Role::Viewer;
    s.put_console_session(&ana, at(0), 3).await.unwrap();
    for n in 0..3 {
        s.put_console_session(&session(n, at(100 + n as i64)), at(0), 3)
            .await
            .unwrap();
    }
    // A fourth: the one closest to its end goes.
    s.put_console_session(&session(9, at(500)), at(1), 3)
        .await
        .unwrap();
    let live = |n: u32| {
        let s = s.clone();
        async move {
            s.get_console_session(&session(n, at(0)).id_hash, at(2))
                .await
                .unwrap()
                .is_some()
        }
    };
    assert!(!live(0).await, "the soonest to end was dropped");
    for n in [1, 2, 9] {
        assert!(live(n).await, "session {n} kept");
    }
    assert!(
        live(50).await,
        "another user's session is not theirs to end"
    );
    assert_eq!(
        s.get_console_session(&a_mark(1).id_hash, at(2))
            .await
            .unwrap()
            .and_then(|k| k.token_mark),
        Some("mark-1".into()),
        "a built-in principal's session keeps its token mark"
    );
    // Many sign-ins by that user end only their own; the cap goes by
    // who signed in, not by the name: a user (id 5) stored under the
    // daemon token's name ends none of the daemon token's sessions.
    let mut impostor = session(40, at(50));
    impostor.user_id = Some(5);
    impostor.role = Role::Viewer;
    impostor.token_mark = None;
    for n in 60..70 {
        let mut more = session(n, at(700 + n as i64));
        more.user_name = "ana".into();
        more.user_id = Some(4);
        more.token_mark = None;
        s.put_console_session(&more, at(1), 3).await.unwrap();
        impostor.id_hash = format!("{:064x}", n + 100);
        s.put_console_session(&impostor, at(1), 3).await.unwrap();
    }
    assert!(!live(50).await, "ana's own oldest made room");
    for n in [1, 2, 9] {
        assert!(live(n).await, "session {n} outlived ana's sign-ins");
    }
    // Expired sessions make room before any live one is dropped.
    s.put_console_session(&session(10, at(600)), at(102), 3)
        .await
        .unwrap();
    for n in [9, 10] {
        assert!(live(n).await, "session {n} kept");
    }
}
