//! The LoRA adapter registry (`zl admin adapters add|list|remove`): each adapter's base model, where workers read
//! it, its SHA-256, and which projects may use it. Served as the model ids `NAME` and `BASE:NAME`; routing sends
//! a request for one to a worker of the base, preferring those where it is resident.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::{AdapterSpec, CommandError, check_name, check_sha, invalid};

/// Adapters registered at once.
pub const MAX_ADAPTERS: usize = 4096;

/// Longest adapter path, in bytes.
pub(super) const MAX_PATH: usize = 4096;

/// Check a registration's fields.
fn check(spec: &AdapterSpec) -> Result<(), CommandError> {
    check_name("name", &spec.name)?;
    if spec.name.contains(':') {
        return Err(invalid("name", "must not contain ':' (it separates BASE:NAME)"));
    }
    check_name("base", &spec.base)?;
    if spec.path.is_empty() || spec.path.len() > MAX_PATH || spec.path.chars().any(char::is_control) {
        return Err(invalid("path", format!("must be 1 to {MAX_PATH} printable bytes")));
    }
    // Relative to the workers' adapter root, and inside it: the workers confine paths too, but the registry is
    // where an operator's typo or an attacker's `../` should be refused, by name.
    if spec.path.starts_with('/') || spec.path.contains('\\') {
        return Err(invalid("path", "must be relative to the workers' adapter root (no leading / or \\)"));
    }
    if spec.path.split('/').any(|part| part == "..") {
        return Err(invalid("path", "must stay inside the workers' adapter root (no .. components)"));
    }
    check_sha("sha256", &spec.sha256)?;
    if !spec.project.is_empty() {
        check_name("project", &spec.project)?;
    }
    Ok(())
}

/// The registered adapters, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adapters {
    by_name: BTreeMap<String, AdapterSpec>,
}

impl Adapters {
    /// Register an adapter. `taken`: the name is a served model's or an alias. Registering the same spec again is
    /// a no-op; a name registered with anything else must be removed first (so a new version is deliberate).
    pub fn add(&mut self, spec: &AdapterSpec, taken: bool) -> Result<(), CommandError> {
        check(spec)?;
        if taken {
            return Err(CommandError::Exists(format!("{} (a model or alias has this name)", spec.name)));
        }
        match self.by_name.get(&spec.name) {
            Some(existing) if existing == spec => Ok(()),
            Some(_) => {
                Err(CommandError::Exists(format!("adapter {} (remove it first to register another)", spec.name)))
            }
            None if self.by_name.len() >= MAX_ADAPTERS => Err(CommandError::Limit("adapters")),
            None => {
                self.by_name.insert(spec.name.clone(), spec.clone());
                Ok(())
            }
        }
    }

    /// Remove an adapter. Running requests that use it finish; new ones no longer find it.
    pub fn remove(&mut self, name: &str) -> Result<(), CommandError> {
        self.by_name.remove(name).map(|_| ()).ok_or_else(|| CommandError::NotFound(format!("adapter {name}")))
    }

    /// Every adapter, by name.
    pub fn all(&self) -> impl Iterator<Item = &AdapterSpec> {
        self.by_name.values()
    }

    /// The adapter a model id names for `project`: `NAME`, or `BASE:NAME` with its base. `None` when it names
    /// none, or one the project may not use (which it cannot tell from one that does not exist).
    pub fn resolve(&self, model: &str, project: &str) -> Option<&AdapterSpec> {
        let spec = match model.split_once(':') {
            Some((base, name)) => self.by_name.get(name).filter(|s| s.base == base)?,
            None => self.by_name.get(model)?,
        };
        spec.visible_to(project).then_some(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, project: &str) -> AdapterSpec {
        AdapterSpec {
            name: name.into(),
            base: "smollm2".into(),
            path: format!("{name}/"),
            sha256: "ab".repeat(32),
            project: project.into(),
            shared: false,
        }
    }

    #[test]
    fn adapters_resolve_by_name_or_base_and_name_for_the_projects_that_may_use_them() {
        let mut a = Adapters::default();
        a.add(&spec("public", ""), false).unwrap();
        a.add(&spec("mine", "acme"), false).unwrap();
        assert_eq!(a.resolve("public", "beta").map(|s| s.name.as_str()), Some("public"));
        assert_eq!(a.resolve("smollm2:public", "").map(|s| s.name.as_str()), Some("public"));
        assert!(a.resolve("other:public", "").is_none(), "another base");
        assert!(a.resolve("mine", "acme").is_some());
        assert!(a.resolve("mine", "beta").is_none(), "private to acme");
        a.remove("mine").unwrap();
        a.add(&AdapterSpec { shared: true, ..spec("mine", "acme") }, false).unwrap();
        assert!(a.resolve("mine", "beta").is_some(), "shared");
    }

    #[test]
    fn bad_or_clashing_registrations_are_refused_with_the_reason() {
        let mut a = Adapters::default();
        a.add(&spec("x", ""), false).unwrap();
        a.add(&spec("x", ""), false).unwrap();
        let other = AdapterSpec { sha256: "cd".repeat(32), ..spec("x", "") };
        assert!(matches!(a.add(&other, false), Err(CommandError::Exists(_))));
        assert!(matches!(a.add(&spec("model-name", ""), true), Err(CommandError::Exists(_))));
        assert!(a.add(&spec("a:b", ""), false).unwrap_err().to_string().contains("':'"));
        assert!(a.add(&AdapterSpec { sha256: "zz".into(), ..spec("y", "") }, false).is_err());
        assert!(a.add(&AdapterSpec { path: String::new(), ..spec("y", "") }, false).is_err());
        for path in ["x/../y", "../y", "/etc/shadow", "..", "a\\..\\b"] {
            let err = a.add(&AdapterSpec { path: path.into(), ..spec("y", "") }, false).unwrap_err();
            assert!(matches!(err, CommandError::Invalid { .. }), "{path}: {err}");
        }
        a.add(&AdapterSpec { path: "team/./y.gguf".into(), ..spec("y", "") }, false).unwrap();
        assert!(matches!(a.remove("nope"), Err(CommandError::NotFound(_))));
    }
}
