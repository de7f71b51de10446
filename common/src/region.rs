//! Region names, checked the same way wherever one is accepted: a tier's `--region`, a key's binding in the routing
//! state and on the wire, a peer region in a frontend's settings, the `x-zl-region` header.

/// The region of a tier that was given none.
pub const DEFAULT_REGION: &str = "local";

/// The most regions a key may be bound to.
pub const MAX_KEY_REGIONS: usize = 16;

/// The longest region name.
pub const MAX_REGION_LEN: usize = 64;

/// Why `name` is not a region name (1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or digit, as
/// cloud regions and Consul datacenters are named), or `None` when it is one.
pub fn region_problem(name: &str) -> Option<String> {
    let ok_char = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.');
    if name.is_empty() || name.len() > MAX_REGION_LEN {
        return Some(format!("region {name:?} must be 1 to {MAX_REGION_LEN} characters"));
    }
    if !name.bytes().all(ok_char) || !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Some(format!(
            "region {name:?} may hold only a-z, 0-9, '-', '_' and '.', starting with a letter or digit"
        ));
    }
    None
}

/// Why `regions` is not a key's region list (each a region name, no repeats, at most [`MAX_KEY_REGIONS`]).
pub fn regions_problem(regions: &[String]) -> Option<String> {
    if regions.len() > MAX_KEY_REGIONS {
        return Some(format!("{} regions, at most {MAX_KEY_REGIONS}", regions.len()));
    }
    for (i, r) in regions.iter().enumerate() {
        if let Some(p) = region_problem(r) {
            return Some(p);
        }
        if regions[..i].contains(r) {
            return Some(format!("region {r:?} is listed twice"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["local", "eu-west-1", "us_east", "dc1", "a.b"] {
            assert_eq!(region_problem(good), None, "{good}");
        }
        for bad in ["", "EU", "-x", "a b", "é", &"a".repeat(65)] {
            assert!(region_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(regions_problem(&["a".into(), "b".into()]), None);
        assert!(regions_problem(&["a".into(), "a".into()]).unwrap().contains("twice"));
        assert!(regions_problem(&vec!["a".to_owned(); 17]).is_some());
    }
}
