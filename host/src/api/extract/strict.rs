//! Reads a type from a parsed JSON value as serde's derive would, except that a struct is
//! read only from an object: serde also accepts an array, taking its items as the fields in
//! declaration order, which lets `["acme", "Acme"]` pass for `{"id": "acme", "name": "Acme"}`.

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer as _, Unexpected, Visitor};
use serde::forward_to_deserialize_any;
use serde_json::{Error, Value};

/// A JSON value read strictly.
pub struct Strict<'a>(pub &'a Value);

impl<'de> de::IntoDeserializer<'de, Error> for Strict<'de> {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for Strict<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.iter().map(Strict));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Value::Object(fields) => {
                let mut map =
                    MapDeserializer::new(fields.iter().map(|(k, v)| (k.as_str(), Strict(v))));
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => Err(de::Error::invalid_type(Unexpected::Seq, &visitor)),
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            Value::Object(fields) if fields.len() == 1 => {
                let (variant, value) = fields.iter().next().expect("one entry");
                visitor.visit_enum(Variant { variant, value })
            }
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier
    }
}

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

/// An externally tagged enum variant: `{"variant": value}`.
struct Variant<'a> {
    variant: &'a str,
    value: &'a Value,
}

impl<'de> de::EnumAccess<'de> for Variant<'de> {
    type Error = Error;
    type Variant = Strict<'de>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), Error> {
        let variant = seed.deserialize(de::value::BorrowedStrDeserializer::<Error>::new(
            self.variant,
        ))?;
        Ok((variant, Strict(self.value)))
    }
}

impl<'de> de::VariantAccess<'de> for Strict<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        de::Deserialize::deserialize(self)
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::Strict;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Host {
        vcpu: u32,
        #[serde(default)]
        memory_gib: Option<i64>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Gpu,
        Nic,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Body {
        id: String,
        host: Host,
        kinds: Vec<Kind>,
        extra: Option<serde_json::Value>,
    }

    fn read(value: serde_json::Value) -> Result<Body, String> {
        serde_path_to_error::deserialize(Strict(&value)).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_what_serde_json_reads_from_objects() {
        let value = json!({ "id": "n1", "host": { "vcpu": 8, "memoryGib": null },
                            "kinds": ["gpu", "nic"], "extra": [1, { "a": [true] }] });
        assert_eq!(
            read(value.clone()).unwrap(),
            serde_json::from_value::<Body>(value).unwrap()
        );
    }

    #[test]
    fn refuses_a_struct_given_as_an_array_and_names_where() {
        let err = read(json!({ "id": "n1", "host": [8], "kinds": [] })).unwrap_err();
        assert!(err.starts_with("host: invalid type: sequence"), "{err}");
        let err = read(json!(["n1", { "vcpu": 8 }, []])).unwrap_err();
        assert!(err.contains("invalid type: sequence"), "{err}");
    }

    #[test]
    fn keeps_serde_json_errors_for_types_unknown_fields_and_variants() {
        let err = read(json!({ "id": 1, "host": { "vcpu": 8 }, "kinds": [] })).unwrap_err();
        assert!(err.starts_with("id: invalid type"), "{err}");
        let err = read(json!({ "id": "n", "host": { "vcpu": -1 }, "kinds": [] })).unwrap_err();
        assert!(err.starts_with("host.vcpu: invalid value"), "{err}");
        let err = read(json!({ "id": "n", "host": { "cpu": 1 }, "kinds": [] })).unwrap_err();
        assert!(err.starts_with("host.cpu: unknown field"), "{err}");
        let err = read(json!({ "id": "n", "host": { "vcpu": 1 }, "kinds": ["fpga"] })).unwrap_err();
        assert!(err.starts_with("kinds[0]: unknown variant"), "{err}");
    }
}
