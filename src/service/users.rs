//! API users: named tokens, each with a role. The token is made here and
//! shown once, at creation; the store keeps its SHA-256 only. Revoking a
//! user refuses its token at once and ends its console sign-ins.

use super::error::ApiError;
use super::Service;
use super::{Allowed, Operation};
use crate::token::{new_user_token, token_hash};
use chrono::{DateTime, Utc};
use herald_actors::domain::{ApiUser, NewApiUser, Role};
use herald_actors::ports::Store;
use schemars::JsonSchema;
use serde::Serialize;

pub static CREATE: Operation = Operation::new("createUser", Role::Admin);
pub static REVOKE: Operation = Operation::new("revokeUser", Role::Admin);
pub static LIST: Operation = Operation::read("listUsers", Role::Admin);
pub static GET: Operation = Operation::read("getUser", Role::Admin);

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "User")]
pub struct UserView {
    pub id: i64,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_by: String,
}

impl From<ApiUser> for UserView {
    fn from(u: ApiUser) -> Self {
        Self {
            id: u.id,
            name: u.name,
            role: u.role,
            created_at: u.created_at,
            expires_at: u.expires_at,
            created_by: u.created_by,
        }
    }
}

/// Every user, by id.
#[derive(Debug, Serialize, JsonSchema)]
pub struct UserList {
    pub items: Vec<UserView>,
}

/// A user as created: with its token, which is shown this once.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NewUser {
    #[serde(flatten)]
    pub user: UserView,
    /// The bearer token, shown this once.
    pub token: String,
}

/// A user to make: checked by the request's rules already.
pub struct UserSpec {
    pub name: String,
    pub role: Role,
    pub expires_at: Option<DateTime<Utc>>,
}

pub struct Users<'a> {
    store: &'a dyn Store,
}

impl<'a> Users<'a> {
    pub fn of(service: &'a Service) -> Self {
        let state = &service.state;
        Self {
            store: state.store.as_ref(),
        }
    }

    /// Makes a user and its token; `by` names who made it.
    pub async fn create(
        &self,
        allowed: Allowed,
        by: &str,
        spec: UserSpec,
    ) -> Result<NewUser, ApiError> {
        allowed.of(&CREATE)?;
        let token = new_user_token();
        let user = self
            .store
            .create_user(&NewApiUser {
                name: spec.name,
                role: spec.role,
                token_hash: token_hash(&token),
                created_at: Utc::now(),
                expires_at: spec.expires_at,
                created_by: by.to_owned(),
            })
            .await?;
        Ok(NewUser {
            user: user.into(),
            token,
        })
    }

    /// Every user, by id; the daemon's own token is not one.
    pub async fn list(&self, allowed: Allowed) -> Result<UserList, ApiError> {
        allowed.of(&LIST)?;
        let items: Vec<UserView> = self
            .store
            .list_users()
            .await?
            .into_iter()
            .map(Into::into)
            .collect();
        Ok(UserList { items })
    }

    pub async fn get(&self, allowed: Allowed, id: i64) -> Result<UserView, ApiError> {
        allowed.of(&GET)?;
        Ok(self.store.get_user(id).await?.into())
    }

    /// The user's token is refused from now on, on every daemon.
    pub async fn revoke(&self, allowed: Allowed, id: i64) -> Result<(), ApiError> {
        allowed.of(&REVOKE)?;
        self.store.delete_user(id).await?;
        Ok(())
    }
}
