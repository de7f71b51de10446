//! Stored Responses API responses (protocol 1.12): a frontend stores one with the orchestrators (replicated, so
//! every frontend of the cluster reads it), and reads or deletes it by project and id.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check::{self, invalid};
use super::{MessageError, fb};

/// The largest stored record (the store lives in the orchestrators' Raft snapshots: docs/api.md).
pub const MAX_STORED_RESPONSE: usize = 1 << 20;

/// A response to store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    /// The project it belongs to.
    pub project: String,
    /// Its id.
    pub id: String,
    /// When it was made, Unix seconds.
    pub created_at: u64,
    /// How long it is kept, seconds.
    pub ttl_s: u32,
    /// The record (JSON).
    pub body: String,
}

impl StoredResponse {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("StoredResponse.project", &self.project, 1, check::MAX_ID_LEN)?;
        check::id("StoredResponse.id", &self.id)?;
        if self.ttl_s == 0 {
            return Err(invalid("StoredResponse.ttl_s", "must be at least 1"));
        }
        check::text("StoredResponse.body", &self.body, 2, MAX_STORED_RESPONSE)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::StoredResponse<'b>> {
        let project = fbb.create_string(&self.project);
        let id = fbb.create_string(&self.id);
        let body = fbb.create_string(&self.body);
        fb::StoredResponse::create(
            fbb,
            &fb::StoredResponseArgs {
                project: Some(project),
                id: Some(id),
                created_at: self.created_at,
                ttl_s: self.ttl_s,
                body: Some(body),
            },
        )
    }

    pub(crate) fn read(t: fb::StoredResponse<'_>) -> Result<Self, MessageError> {
        check::text("StoredResponse.body", t.body(), 0, MAX_STORED_RESPONSE)?;
        let msg = StoredResponse {
            project: t.project().to_owned(),
            id: t.id().to_owned(),
            created_at: t.created_at(),
            ttl_s: t.ttl_s(),
            body: t.body().to_owned(),
        };
        msg.check()?;
        Ok(msg)
    }
}

/// Read or delete a stored response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseLookup {
    /// The caller's project.
    pub project: String,
    /// The response's id.
    pub id: String,
    /// Delete it instead of reading it.
    pub delete: bool,
}

impl ResponseLookup {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("ResponseLookup.project", &self.project, 1, check::MAX_ID_LEN)?;
        check::id("ResponseLookup.id", &self.id)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::ResponseLookup<'b>> {
        let project = fbb.create_string(&self.project);
        let id = fbb.create_string(&self.id);
        fb::ResponseLookup::create(
            fbb,
            &fb::ResponseLookupArgs { project: Some(project), id: Some(id), delete: self.delete },
        )
    }

    pub(crate) fn read(t: fb::ResponseLookup<'_>) -> Result<Self, MessageError> {
        let msg = ResponseLookup { project: t.project().to_owned(), id: t.id().to_owned(), delete: t.delete() };
        msg.check()?;
        Ok(msg)
    }
}

/// What a lookup found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponseFound {
    /// Whether the project holds (held, for a delete) a live response of that id.
    pub found: bool,
    /// Its record (empty for a delete or when not found).
    pub body: String,
    /// When it was made, Unix seconds.
    pub created_at: u64,
}

impl ResponseFound {
    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::text("ResponseFound.body", &self.body, 0, MAX_STORED_RESPONSE)?;
        if !self.found && !self.body.is_empty() {
            return Err(invalid("ResponseFound.body", "a response not found has no record"));
        }
        Ok(())
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::ResponseFound<'b>> {
        let body = fbb.create_string(&self.body);
        fb::ResponseFound::create(
            fbb,
            &fb::ResponseFoundArgs { found: self.found, body: Some(body), created_at: self.created_at },
        )
    }

    pub(crate) fn read(t: fb::ResponseFound<'_>) -> Result<Self, MessageError> {
        let body = t.body().unwrap_or_default();
        check::text("ResponseFound.body", body, 0, MAX_STORED_RESPONSE)?;
        let msg = ResponseFound { found: t.found(), body: body.to_owned(), created_at: t.created_at() };
        msg.check()?;
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> StoredResponse {
        StoredResponse { project: "acme".into(), id: "resp_1".into(), created_at: 1, ttl_s: 60, body: "{}".into() }
    }

    #[test]
    fn empty_oversized_and_inconsistent_ones_are_refused() {
        assert!(stored().check().is_ok());
        assert!(StoredResponse { ttl_s: 0, ..stored() }.check().is_err());
        assert!(StoredResponse { project: String::new(), ..stored() }.check().is_err());
        assert!(StoredResponse { body: "x".repeat(MAX_STORED_RESPONSE + 1), ..stored() }.check().is_err());
        let lookup = ResponseLookup { project: "acme".into(), id: String::new(), delete: false };
        assert!(lookup.check().is_err());
        assert!(ResponseFound { found: false, body: "{}".into(), created_at: 0 }.check().is_err());
        assert!(ResponseFound { found: true, body: "{}".into(), created_at: 0 }.check().is_ok());
    }
}
