//! Who is calling: the bearer token names a [`Principal`] (the daemon's
//! own `control.token`, the first admin, or a named API user with a
//! role). The [`Guard`] finds it; what it may do is decided on the route
//! that runs (`authority`).

use super::errors::{ApiError, Kind};
use crate::settings::Secret;
use chrono::Utc;
use herald_actors::domain::Role;
use herald_actors::ports::IdentityStore;
use std::sync::Arc;
use subtle::ConstantTimeEq as _;

/// The name the daemon's own token acts under in the audit log (no user
/// may take it).
pub const DAEMON_TOKEN: &str = herald_actors::domain::BUILT_IN_PRINCIPALS[0];
/// The name requests act under with `control.token = "none"`.
pub const NO_TOKEN: &str = herald_actors::domain::BUILT_IN_PRINCIPALS[1];
pub use crate::token::{token_hash, USER_TOKEN_PREFIX};

/// Who a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The API user; `None` for the daemon's own token.
    pub user_id: Option<i64>,
    pub name: String,
    pub role: Role,
}

impl Principal {
    pub fn daemon() -> Self {
        Self {
            user_id: None,
            name: DAEMON_TOKEN.into(),
            role: Role::Admin,
        }
    }

    /// The daemon's own token (not a user's, not an open port's anonymous
    /// caller): what another daemon of the cluster forwards with.
    pub fn is_daemon(&self) -> bool {
        self.user_id.is_none() && self.name == DAEMON_TOKEN
    }

    /// A refusal naming what `route` needs and what this caller has.
    pub fn refuse(&self, what: &str, needed: Role) -> ApiError {
        ApiError::field_error(
            Kind::NeedsRole,
            "role",
            format!(
                "{what} needs the {needed} role; {} has the {} role",
                self.name, self.role
            ),
        )
    }
}

/// The daemon's token and the store of user tokens.
/// The daemon's token is read once at start-up (changing it takes a
/// restart); users are read from the store on every request, so a
/// revoked or expired token is refused at once, on every daemon.
#[derive(Clone)]
pub struct Guard {
    daemon: Option<Arc<Secret>>,
    store: Option<Arc<dyn IdentityStore>>,
}

impl Guard {
    /// `daemon`: `None` leaves `/v1` open (only with `control.token =
    /// "none"`, which settings validation refuses on a non-loopback
    /// address). `store`: where users are found; `None` knows only the
    /// daemon's token.
    pub fn new(daemon: Option<Secret>, store: Option<Arc<dyn IdentityStore>>) -> Self {
        Self {
            daemon: daemon.map(Arc::new),
            store,
        }
    }

    /// No token is configured (`control.token = "none"`).
    pub fn is_open(&self) -> bool {
        self.daemon.is_none()
    }

    /// The principal of a bare token (the console's sign-in form).
    pub async fn principal_of_token(&self, token: &str) -> Result<Principal, ApiError> {
        let Some(expected) = &self.daemon else {
            return Ok(Principal {
                user_id: None,
                name: NO_TOKEN.into(),
                role: Role::Admin,
            });
        };
        // The comparison takes the same time wherever the first
        // difference is.
        if bool::from(token.as_bytes().ct_eq(expected.expose().as_bytes())) {
            return Ok(Principal::daemon());
        }
        if token.starts_with(USER_TOKEN_PREFIX) {
            if let Some(store) = &self.store {
                // Looked up by hash: the database never compares secrets.
                match store.user_by_token(&token_hash(token), Utc::now()).await {
                    Ok(Some(u)) => {
                        return Ok(Principal {
                            user_id: Some(u.id),
                            name: u.name,
                            role: u.role,
                        })
                    }
                    Ok(None) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Err(ApiError::new(
            Kind::Unauthorized,
            "the bearer token is neither this daemon's token nor a live user's (revoked or \
             expired tokens are refused)",
        ))
    }

    /// The live user `id` (not revoked, not expired), as a principal: whom
    /// another daemon forwarded a request for.
    pub async fn user(&self, id: i64) -> Result<Option<Principal>, ApiError> {
        let Some(store) = &self.store else {
            return Ok(None);
        };
        match store.get_user(id).await {
            Ok(u) if u.is_live(Utc::now()) => Ok(Some(Principal {
                user_id: Some(u.id),
                name: u.name,
                role: u.role,
            })),
            Ok(_) | Err(herald_actors::ports::StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Accepts `Authorization: Bearer <token>` only.
    pub async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Principal, ApiError> {
        if self.is_open() {
            return self.principal_of_token("").await;
        }
        let Some(value) = authorization else {
            return Err(ApiError::new(
                Kind::Unauthorized,
                "this route needs an Authorization: Bearer <token> header",
            ));
        };
        let given = value
            .strip_prefix(b"Bearer ")
            .or_else(|| value.strip_prefix(b"bearer "))
            .unwrap_or(b"");
        let given = std::str::from_utf8(given)
            .map_err(|_| ApiError::new(Kind::Unauthorized, "the bearer token is not valid text"))?;
        self.principal_of_token(given).await
    }
}

/// The caller of a route, as its authority wrapper left it. A handler
/// that asks for one on a route without that wrapper fails closed (500)
/// rather than act for anybody.
impl actix_web::FromRequest for Principal {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &actix_web::HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        use actix_web::HttpMessage;
        std::future::ready(req.extensions().get::<Principal>().cloned().ok_or_else(|| {
            ApiError::new(
                Kind::Internal,
                "this route was reached without its authority wrapper: nobody to act for",
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_without_a_token() {
        let p = Guard::new(None, None).authenticate(None).await.unwrap();
        assert_eq!(p.name, NO_TOKEN);
        assert_eq!(p.role, Role::Admin);
    }

    #[tokio::test]
    async fn needs_the_exact_bearer_token() {
        let g = Guard::new(Some(Secret::new("s3cret")), None);
        assert_eq!(
            g.authenticate(Some(b"Bearer s3cret")).await.unwrap(),
            Principal::daemon()
        );
        for bad in [
            None,
            Some(&b"Bearer s3cre"[..]),
            Some(b"Bearer s3cret "),
            Some(b"s3cret"),
            Some(b"Basic s3cret"),
            Some(b"Bearer "),
            Some(b"Bearer hrld_0000"),
        ] {
            let e = g.authenticate(bad).await.unwrap_err();
            assert_eq!(e.kind, Kind::Unauthorized, "{bad:?}");
        }
    }
}
