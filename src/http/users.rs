//! `/v1/users`: named API tokens, each with a role. The token is made by
//! Herald and shown once, at creation; the store keeps its SHA-256 only.
//! Revoking a user refuses its token at once and ends its console
//! sign-ins.

use super::errors::{ApiError, Kind};
use super::extract::{positive_id, Json, JsonBody};
use super::principal::Principal;
use super::spec::{Body, Field, Op, Param, Rule, Shape, Str, Success};
use crate::service::users::{self, NewUser, UserList, UserSpec, UserView, Users};
use crate::service::Allowed;
use crate::service::Service;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use herald_actors::domain::{check_user_name, Role};
use serde::Deserialize;

pub const USER_ID: Param = Param::new(
    "id",
    Rule::Int {
        min: 1,
        max: i64::MAX,
    },
    "User id",
);

fn role_names() -> &'static [&'static str] {
    Role::NAMES
}

pub static NEW_USER: Shape = Shape {
    name: "CreateUser",
    description: "A new API user",
    fields: &[
        Field::req(
            "name",
            Rule::Str(Str::pattern(
                r"^[A-Za-z0-9._@-]{1,64}$",
                "must be 1 to 64 ASCII letters, digits or . _ @ -",
            )),
            "Unique; shown in the audit log",
        ),
        Field::req(
            "role",
            Rule::Str(Str::one_of(role_names)),
            "viewer reads; operator also writes reminders, runs, groups and media; admin also \
             manages accounts, pairing, users and reads the audit log",
        ),
        Field::nullable(
            "expires_at",
            Rule::Str(Str {
                format: Some("date-time"),
                ..Str::ANY
            }),
            "When the token stops working (RFC 3339, in the future); null: until revoked",
        ),
    ],
    example: Some(r#"{"name": "ana", "role": "operator", "expires_at": null}"#),
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateUser {
    name: String,
    role: String,
    #[serde(default)]
    expires_at: Option<String>,
}

impl JsonBody for CreateUser {
    const SHAPE: &'static Shape = &NEW_USER;
}

impl CreateUser {
    fn parse(self, now: DateTime<Utc>) -> Result<(String, Role, Option<DateTime<Utc>>), ApiError> {
        check_user_name(&self.name)?;
        let role: Role = self.role.parse()?;
        let expires_at = match self.expires_at {
            None => None,
            Some(text) => {
                let t = DateTime::parse_from_rfc3339(&text)
                    .map_err(|_| {
                        ApiError::field_error(
                            Kind::Validation,
                            "expires_at",
                            "must be an RFC 3339 time with an offset, such as \
                             2027-01-01T00:00:00Z",
                        )
                    })?
                    .with_timezone(&Utc);
                if t <= now {
                    return Err(ApiError::field_error(
                        Kind::Validation,
                        "expires_at",
                        "must be in the future",
                    ));
                }
                Some(t)
            }
        };
        Ok((self.name, role, expires_at))
    }
}

pub static CREATE: Op = Op::new(
    "createUser",
    "Add an API user",
    Success::json::<NewUser>(201, "Created; `token` is shown this once").location(),
)
.describe(
    "Herald makes the token (`hrld_…`) and answers it once: store it now, it cannot be read \
     again. 409 if the name is taken.",
)
.body(Body::Json(&NEW_USER))
.errors(&[409])
.performs(&users::CREATE);

pub static LIST: Op = Op::new(
    "listUsers",
    "List API users",
    Success::json::<UserList>(200, "Every user, by id"),
)
.describe("Tokens are never shown again; the daemon's own `control.token` is not listed.")
.performs(&users::LIST);

pub static GET: Op = Op::new(
    "getUser",
    "One API user",
    Success::json::<UserView>(200, "The user"),
)
.path(&[USER_ID])
.performs(&users::GET);

pub static REVOKE: Op = Op::new(
    "revokeUser",
    "Revoke an API user",
    Success::no_content("Revoked"),
)
.describe("The token is refused from now on, on every daemon; the user's console sign-ins end.")
.path(&[USER_ID])
.performs(&users::REVOKE);

/// The body's fields by the request's rules; the console's form comes
/// through here too.
pub fn spec_of(body: CreateUser) -> Result<UserSpec, ApiError> {
    let (name, role, expires_at) = body.parse(Utc::now())?;
    Ok(UserSpec {
        name,
        role,
        expires_at,
    })
}

pub async fn create(
    service: web::Data<Service>,
    who: Principal,
    body: Json<CreateUser>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let made = Users::of(&service)
        .create(allowed, &who.name, spec_of(body.0)?)
        .await?;
    Ok(HttpResponse::Created()
        .insert_header(("Location", format!("/v1/users/{}", made.user.id)))
        .json(made))
}

pub async fn list(service: web::Data<Service>, allowed: Allowed) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Users::of(&service).list(allowed).await?))
}

pub async fn get(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "user")?;
    Ok(HttpResponse::Ok().json(Users::of(&service).get(allowed, id).await?))
}

pub async fn revoke(
    service: web::Data<Service>,
    path: web::Path<String>,
    allowed: Allowed,
) -> Result<HttpResponse, ApiError> {
    let id = positive_id(&path, "user")?;
    Users::of(&service).revoke(allowed, id).await?;
    Ok(HttpResponse::NoContent().finish())
}

impl CreateUser {
    /// The console's form, as the API's body.
    pub fn from_form(name: &str, role: &str, expires_at: Option<&str>) -> Self {
        Self {
            name: name.to_owned(),
            role: role.to_owned(),
            expires_at: expires_at.map(str::to_owned),
        }
    }
}
