//! Integer fields of request bodies. A JSON number with no fractional part is an integer
//! wherever a request takes one (`"max_tokens": 16.0` is 16), as llama.cpp's server (nlohmann
//! json) and OpenAI's (pydantic's lax mode) read them; a fraction, a value outside the field's
//! type, or anything but a number is refused, and `extract::parse` answers that with a 400
//! naming the field. The documented type stays `integer`: `16.0` is one in JSON Schema too.
//!
//! Every integer a request body carries is read here: `Option<T>` fields with
//! `#[serde(default, deserialize_with = "crate::gateway::int::opt")]`, lists of token ids with
//! [`list`] and [`lists`].

use serde::de::{Deserialize, Deserializer, Error, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// An integer type a request field is read as.
pub trait Integer: Copy + TryFrom<i128> {
    const MIN: i128;
    const MAX: i128;
}

impl Integer for u32 {
    const MIN: i128 = u32::MIN as i128;
    const MAX: i128 = u32::MAX as i128;
}

impl Integer for i64 {
    const MIN: i128 = i64::MIN as i128;
    const MAX: i128 = i64::MAX as i128;
}

/// One integer of type `T`, from a JSON integer or an integral float within `T`'s range.
struct Int<T>(T);

struct IntVisitor<T>(PhantomData<T>);

impl<T: Integer> IntVisitor<T> {
    fn within<E: Error>(&self, v: i128, seen: impl fmt::Display) -> Result<T, E> {
        if (T::MIN..=T::MAX).contains(&v) {
            if let Ok(t) = T::try_from(v) {
                return Ok(t);
            }
        }
        Err(self.refuse(seen))
    }

    /// serde's "invalid value" message, with floats written as Rust's `Debug` does (`1e300`,
    /// not 301 digits).
    fn refuse<E: Error>(&self, seen: impl fmt::Display) -> E {
        E::custom(format_args!(
            "invalid value: {seen}, expected {}",
            Expecting(self)
        ))
    }
}

struct Expecting<'a, T>(&'a IntVisitor<T>);

impl<T: Integer> fmt::Display for Expecting<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        self.0.expecting(f)
    }
}

impl<T: Integer> Visitor<'_> for IntVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an integer from {} to {}", T::MIN, T::MAX)
    }

    fn visit_i64<E: Error>(self, v: i64) -> Result<T, E> {
        self.within(v.into(), v)
    }

    fn visit_u64<E: Error>(self, v: u64) -> Result<T, E> {
        self.within(v.into(), v)
    }

    fn visit_f64<E: Error>(self, v: f64) -> Result<T, E> {
        // every type here fits in ±2^64, where an integral f64 converts to i128 exactly
        const BOUND: f64 = 18_446_744_073_709_551_616.0; // 2^64
        if v.is_finite() && v.fract() == 0.0 && v.abs() < BOUND {
            return self.within(v as i128, format_args!("{v:?}"));
        }
        Err(self.refuse(format_args!("{v:?}")))
    }
}

impl<'de, T: Integer> Deserialize<'de> for Int<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IntVisitor(PhantomData)).map(Int)
    }
}

/// An optional integer field (absent or null: None).
pub fn opt<'de, D: Deserializer<'de>, T: Integer>(d: D) -> Result<Option<T>, D::Error> {
    Ok(Option::<Int<T>>::deserialize(d)?.map(|i| i.0))
}

/// A list of integers (a prompt's token ids).
pub fn list<'de, D: Deserializer<'de>, T: Integer>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Vec::<Int<T>>::deserialize(d)?
        .into_iter()
        .map(|i| i.0)
        .collect())
}

/// A list of lists of integers (prompts' token ids).
pub fn lists<'de, D: Deserializer<'de>, T: Integer>(d: D) -> Result<Vec<Vec<T>>, D::Error> {
    Ok(Vec::<Vec<Int<T>>>::deserialize(d)?
        .into_iter()
        .map(|l| l.into_iter().map(|i| i.0).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(serde::Deserialize, Debug)]
    struct R {
        #[serde(default, deserialize_with = "opt")]
        n: Option<u32>,
        #[serde(default, deserialize_with = "opt")]
        seed: Option<i64>,
    }

    fn n(v: serde_json::Value) -> Result<Option<u32>, String> {
        serde_json::from_value::<R>(json!({ "n": v }))
            .map(|r| r.n)
            .map_err(|e| e.to_string())
    }

    fn seed(v: serde_json::Value) -> Result<Option<i64>, String> {
        serde_json::from_value::<R>(json!({ "seed": v }))
            .map(|r| r.seed)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn integral_floats_are_integers() {
        assert_eq!(n(json!(16)), Ok(Some(16)));
        assert_eq!(n(json!(16.0)), Ok(Some(16)));
        assert_eq!(n(json!(-0.0)), Ok(Some(0)));
        assert_eq!(n(json!(1e2)), Ok(Some(100)));
        assert_eq!(n(json!(4294967295.0)), Ok(Some(u32::MAX)));
        assert_eq!(n(json!(null)), Ok(None));
        assert_eq!(seed(json!(-42.0)), Ok(Some(-42)));
        assert_eq!(seed(json!(i64::MIN)), Ok(Some(i64::MIN)));
        // -2^63 is exact as an f64
        assert_eq!(seed(json!(-9223372036854775808.0)), Ok(Some(i64::MIN)));
        let absent: R = serde_json::from_value(json!({})).expect("absent");
        assert_eq!((absent.n, absent.seed), (None, None));
    }

    #[test]
    fn fractions_and_out_of_range_values_are_refused() {
        for (v, shows) in [
            (json!(16.5), "16.5"),
            (json!(-1), "-1"),
            (json!(-1.0), "-1.0"),
            (json!(4294967296u64), "4294967296"),
            (json!(4294967296.0), "4294967296.0"),
            (json!(1e300), "1e300"),
            (json!(f64::MAX), "1.7976931348623157e308"),
            (json!(1e-300), "1e-300"),
        ] {
            let e = n(v.clone()).expect_err(&v.to_string());
            assert!(
                e.contains(shows) && e.contains("an integer from 0 to 4294967295"),
                "{v}: {e}"
            );
        }
        for v in [json!("16"), json!(true), json!([16]), json!({"n": 16})] {
            let e = n(v.clone()).expect_err(&v.to_string());
            assert!(e.contains("invalid type"), "{v}: {e}");
        }
        // 2^63 is just past i64
        let e = seed(json!(9223372036854775808.0)).expect_err("2^63");
        assert!(e.contains("an integer from"), "{e}");
        assert!(seed(json!(u64::MAX)).is_err());
    }

    #[test]
    fn lists_of_ids() {
        #[derive(serde::Deserialize)]
        struct L {
            #[serde(deserialize_with = "list")]
            a: Vec<u32>,
            #[serde(deserialize_with = "lists")]
            b: Vec<Vec<u32>>,
        }
        let l: L = serde_json::from_value(json!({"a": [1, 2.0], "b": [[3.0], []]})).expect("ok");
        assert_eq!((l.a, l.b), (vec![1, 2], vec![vec![3], vec![]]));
        assert!(serde_json::from_value::<L>(json!({"a": [1.5], "b": []})).is_err());
    }
}
