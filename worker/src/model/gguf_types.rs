//! The tensor types of a GGUF file read from its header alone, so that a file holding a type this build has no
//! kernel for (the IQ and TQ families, MXFP4) is refused with the tensor and the type named, where the general
//! reader only says it met an unknown type number. Every length and count is bounded before it is used.

use std::io::Read;

/// Longest string the scan accepts (a chat template, a token).
const MAX_STRING: u64 = 16 << 20;

/// Most entries of an array, of metadata keys or of tensors the scan accepts.
const MAX_COUNT: u64 = 1 << 26;

/// The name llama.cpp gives GGML type `id`.
pub fn type_name(id: u32) -> String {
    let name = match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        30 => "BF16",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("GGML type {id}"),
    };
    name.to_string()
}

/// Each tensor's name and GGML type number, in file order.
pub fn tensor_types(r: &mut impl Read) -> std::io::Result<Vec<(String, u32)>> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    if u32le(r)? != u32::from_le_bytes(*b"GGUF") {
        return Err(bad("not a GGUF file"));
    }
    let version = u32le(r)?;
    if !(2..=3).contains(&version) {
        return Err(bad("unsupported GGUF version"));
    }
    let (tensors, kvs) = (count(r)?, count(r)?);
    for _ in 0..kvs {
        skip_string(r)?;
        let ty = u32le(r)?;
        skip_value(r, ty)?;
    }
    let mut out = Vec::new();
    for _ in 0..tensors {
        let name = string(r)?;
        let dims = u32le(r)?;
        if dims > 8 {
            return Err(bad("a tensor with more than 8 dimensions"));
        }
        for _ in 0..dims {
            u64le(r)?;
        }
        let ty = u32le(r)?;
        u64le(r)?;
        out.push((name, ty));
    }
    Ok(out)
}

fn u32le(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn u64le(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn count(r: &mut impl Read) -> std::io::Result<u64> {
    let n = u64le(r)?;
    if n > MAX_COUNT {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a GGUF count is implausibly large"));
    }
    Ok(n)
}

fn string(r: &mut impl Read) -> std::io::Result<String> {
    let len = u64le(r)?;
    if len > MAX_STRING {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a GGUF string is implausibly long"));
    }
    let mut b = Vec::new();
    r.take(len).read_to_end(&mut b)?;
    if b.len() as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(String::from_utf8_lossy(&b).into_owned())
}

fn skip_string(r: &mut impl Read) -> std::io::Result<()> {
    string(r).map(drop)
}

fn skip_value(r: &mut impl Read, ty: u32) -> std::io::Result<()> {
    let fixed = |r: &mut dyn Read, n: u64| -> std::io::Result<()> {
        let copied = std::io::copy(&mut r.take(n), &mut std::io::sink())?;
        if copied == n { Ok(()) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) }
    };
    match ty {
        0 | 1 | 7 => fixed(r, 1),
        2 | 3 => fixed(r, 2),
        4..=6 => fixed(r, 4),
        10..=12 => fixed(r, 8),
        8 => skip_string(r),
        9 => {
            let item = u32le(r)?;
            let n = count(r)?;
            if item == 9 {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "nested GGUF arrays"));
            }
            (0..n).try_for_each(|_| skip_value(r, item))
        }
        _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("GGUF value type {ty}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gguf(tensors: &[(&str, u32)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(2u64.to_le_bytes());
        let string = |b: &mut Vec<u8>, s: &str| {
            b.extend((s.len() as u64).to_le_bytes());
            b.extend(s.as_bytes());
        };
        string(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        string(&mut b, "llama");
        string(&mut b, "tokenizer.ggml.scores");
        b.extend(9u32.to_le_bytes());
        b.extend(6u32.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        b.extend([0u8; 12]);
        for (name, ty) in tensors {
            string(&mut b, name);
            b.extend(2u32.to_le_bytes());
            b.extend(256u64.to_le_bytes());
            b.extend(4u64.to_le_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    #[test]
    fn reads_each_tensors_type_and_names_it() {
        let file = gguf(&[("token_embd.weight", 14), ("blk.0.attn_q.weight", 16)]);
        let types = tensor_types(&mut &file[..]).unwrap();
        assert_eq!(types, vec![("token_embd.weight".to_string(), 14), ("blk.0.attn_q.weight".to_string(), 16)]);
        assert_eq!(type_name(16), "IQ2_XXS");
        assert_eq!(type_name(99), "GGML type 99");
    }

    #[test]
    fn truncated_or_hostile_headers_fail_cleanly() {
        let file = gguf(&[("a", 12)]);
        for cut in [3, 10, 30, file.len() - 1] {
            assert!(tensor_types(&mut &file[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = file.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(tensor_types(&mut &huge[..]).is_err());
    }
}
