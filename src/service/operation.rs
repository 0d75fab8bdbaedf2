//! An operation's declaration and the proof that a caller may perform it.

use super::error::{ApiError, Kind};
use herald_actors::domain::Role;

/// An operation a caller may ask for.
#[derive(Debug)]
pub struct Operation {
    /// The OpenAPI operationId; the audit log names writes by it.
    pub id: &'static str,
    /// The least role that may perform it.
    pub role: Role,
    /// Changes nothing: a proof of any operation needing at least its role
    /// opens it too (a page that shows several things checks once).
    pub reads: bool,
    /// Performed by whichever daemon holds the account (it answers
    /// [`Done`]): only such an operation takes a request another daemon
    /// forwarded; any other refuses the forwarding header.
    pub forwards: bool,
}

impl Operation {
    /// An operation that changes something: only its own proof opens it.
    pub const fn new(id: &'static str, role: Role) -> Self {
        Self {
            id,
            role,
            reads: false,
            forwards: false,
        }
    }

    /// An operation that only reads.
    pub const fn read(id: &'static str, role: Role) -> Self {
        Self {
            id,
            role,
            reads: true,
            forwards: false,
        }
    }

    /// Performed on the daemon that holds the account: another daemon may
    /// forward it there.
    pub const fn forwarded(mut self) -> Self {
        self.forwards = true;
        self
    }

    /// The caller's `role` checked against this operation: the proof its
    /// function takes, or the refusal naming the role it needs.
    pub fn allow(&'static self, role: Role) -> Result<Allowed, ApiError> {
        if role.allows(self.role) {
            Ok(Allowed { op: self })
        } else {
            Err(ApiError::field_error(
                Kind::NeedsRole,
                "role",
                format!(
                    "{} needs the {} role; the caller has the {role} role",
                    self.id, self.role
                ),
            ))
        }
    }
}

/// Proof that the caller's role was checked against one operation.
#[derive(Debug, Clone, Copy)]
pub struct Allowed {
    op: &'static Operation,
}

impl Allowed {
    /// The operation this proof was made for.
    pub fn operation(self) -> &'static Operation {
        self.op
    }

    /// Refuses a proof made for another operation (a wiring mistake in an
    /// adapter, answered as an internal error rather than performed),
    /// unless `op` only reads and the proof's operation needs at least its
    /// role: the caller's role was checked against that.
    pub(super) fn of(self, op: &'static Operation) -> Result<(), ApiError> {
        if std::ptr::eq(self.op, op) || (op.reads && self.op.role.allows(op.role)) {
            Ok(())
        } else {
            Err(ApiError::internal(
                "an operation was called with another's check",
                format_args!("{} was called with the check of {}", op.id, self.op.id),
            ))
        }
    }
}

/// What an operation on an account's actor did: done here, or to be asked
/// of the daemon that holds the account (the adapter forwards it).
#[derive(Debug)]
pub enum Done<T> {
    Here(T),
    Elsewhere {
        node: String,
        url: String,
        /// The `/v1` path that performs it there.
        path: String,
        /// Its JSON body, if it takes one.
        body: Option<serde_json::Value>,
        /// A read, asked with GET (else POSTed).
        read: bool,
    },
}
