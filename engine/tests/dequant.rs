//! The scalar dequantiser (the exact path, and the oracle of every fast kernel) against the
//! `gguf` Python package's reference on random blocks of every quantised type Tandem loads
//! (tests/golden/dequant.json, made by scripts/golden/make_dequant_fixtures.py).

use std::path::PathBuf;

use tandem_engine::model_files::dtype::{dequantize, GgmlType};

fn fixtures() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden/dequant.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn every_quantised_type_dequantises_as_the_reference_does() {
    let all = fixtures();
    let mut checked = Vec::new();
    for ty in GgmlType::ALL.into_iter().filter(|t| t.block_size() > 1) {
        let case = &all[ty.name()];
        assert!(case.is_object(), "no reference for {}", ty.name());
        let bytes = hex(case["bytes"].as_str().unwrap());
        let want: Vec<f32> =
            case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(bytes.len(), ty.bytes_for(want.len()), "{}", ty.name());
        let mut got = vec![0f32; want.len()];
        dequantize(ty, &bytes, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // The reference multiplies in another order: allow a few ulps.
            let tol = 1e-6 * w.abs().max(1e-3);
            assert!(
                (g - w).abs() <= tol,
                "{} element {i} (block {}, offset {}): {g} vs reference {w}",
                ty.name(),
                i / ty.block_size(),
                i % ty.block_size()
            );
        }
        checked.push(ty.name());
    }
    assert_eq!(checked.len(), 10, "{checked:?}");
}

#[test]
fn unsupported_types_are_named_with_the_supported_list() {
    // IQ4_XS (id 23) is not loaded; its name is reported, never a bare number.
    assert_eq!(GgmlType::from_id(23), None);
    assert_eq!(GgmlType::name_of_id(23), "IQ4_XS");
    for ty in GgmlType::ALL {
        let id = (0..64).find(|&i| GgmlType::from_id(i) == Some(ty)).unwrap();
        assert_eq!(GgmlType::name_of_id(id), ty.name());
    }
}
