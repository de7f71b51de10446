//! LoRA adapters on the wire (protocol 1.8): the reference a request runs with (route decision, generate
//! request) and the registry entry frontends sync.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::check;
use super::{MessageError, fb};

/// A LoRA adapter a request runs with, as the registry holds it (protocol 1.8).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AdapterRef {
    /// Its registered name (1 to `MAX_ID_LEN` bytes).
    pub name: String,
    /// Where workers read it: a PEFT directory or a GGUF adapter file (1 to `MAX_PATH_LEN` bytes).
    pub path: String,
    /// SHA-256 of its weights file.
    pub sha256: [u8; 32],
}

impl AdapterRef {
    pub(crate) fn check(&self, field: &'static str) -> Result<(), MessageError> {
        check::id(field, &self.name)?;
        check::text(field, &self.path, 1, check::MAX_PATH_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::AdapterRef<'b>> {
        let name = fbb.create_string(&self.name);
        let path = fbb.create_string(&self.path);
        let sha256 = fbb.create_vector(&self.sha256);
        fb::AdapterRef::create(fbb, &fb::AdapterRefArgs { name: Some(name), path: Some(path), sha256: Some(sha256) })
    }

    pub(crate) fn read(field: &'static str, t: Option<fb::AdapterRef<'_>>) -> Result<Option<Self>, MessageError> {
        let Some(t) = t else { return Ok(None) };
        let adapter = AdapterRef {
            name: t.name().to_owned(),
            path: t.path().to_owned(),
            sha256: check::sha256(field, t.sha256().bytes())?,
        };
        adapter.check(field)?;
        Ok(Some(adapter))
    }
}

/// A registered adapter as frontends see it: served as `NAME` and `BASE:NAME` to the projects that may use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterInfo {
    /// Its registered name.
    pub name: String,
    /// The model id it applies to.
    pub base: String,
    /// The project that owns it; empty: every project may use it.
    pub project: String,
    /// Usable by every project although owned by one.
    pub shared: bool,
    /// SHA-256 of its weights file.
    pub sha256: [u8; 32],
}

impl AdapterInfo {
    /// Whether `project` may use it.
    pub fn visible_to(&self, project: &str) -> bool {
        self.project.is_empty() || self.shared || self.project == project
    }

    pub(crate) fn check(&self) -> Result<(), MessageError> {
        check::id("AdapterInfo.name", &self.name)?;
        check::id("AdapterInfo.base", &self.base)?;
        check::text("AdapterInfo.project", &self.project, 0, check::MAX_ID_LEN)
    }

    pub(crate) fn write<'b>(&self, fbb: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::AdapterInfo<'b>> {
        let name = fbb.create_string(&self.name);
        let base = fbb.create_string(&self.base);
        let project = (!self.project.is_empty()).then(|| fbb.create_string(&self.project));
        let sha256 = fbb.create_vector(&self.sha256);
        fb::AdapterInfo::create(
            fbb,
            &fb::AdapterInfoArgs {
                name: Some(name),
                base: Some(base),
                project,
                shared: self.shared,
                sha256: Some(sha256),
            },
        )
    }

    pub(crate) fn read(t: fb::AdapterInfo<'_>) -> Result<Self, MessageError> {
        let info = AdapterInfo {
            name: t.name().to_owned(),
            base: t.base().to_owned(),
            project: t.project().unwrap_or_default().to_owned(),
            shared: t.shared(),
            sha256: match t.sha256() {
                Some(v) => check::sha256("AdapterInfo.sha256", v.bytes())?,
                None => return Err(super::check::invalid("AdapterInfo.sha256", "is missing")),
            },
        };
        info.check()?;
        Ok(info)
    }
}
