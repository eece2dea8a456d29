//! The serde [`Deserializer`](de::Deserializer) over the [`Reader`]'s events: each scalar resolved for the type a
//! field wants, sequences and mappings visited event by event, errors placed at the event that caused them.

use saphyr_parser::{Event, ScalarStyle};
use serde::de::{self, DeserializeSeed, Visitor};

use super::scalar::{invalid_type, is_null, parse_bool, parse_float, parse_int, plain, visit_text};
use super::{Error, Reader, Step};

impl<'a> Reader<'a> {
    /// Visits the sequence whose start was just taken, up to and with its end.
    fn sequence<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        self.enter()?;
        let value = visitor.visit_seq(Seq {
            reader: self,
            index: 0,
            empty: false,
        })?;
        self.depth -= 1;
        match self.next()? {
            (Event::SequenceEnd, _) => Ok(value),
            _ => Err(de::Error::custom("the sequence has more entries than expected")),
        }
    }

    /// Visits the mapping whose start was just taken, up to and with its end.
    fn mapping<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        self.enter()?;
        let value = visitor.visit_map(Map {
            reader: self,
            empty: false,
        })?;
        self.depth -= 1;
        match self.next()? {
            (Event::MappingEnd, _) => Ok(value),
            _ => Err(de::Error::custom("the mapping has more entries than expected")),
        }
    }

    fn unsigned<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        self.with(|_, (event, _)| {
            let int = plain(&event)
                .filter(|p| !p.starts_with('-'))
                .and_then(parse_int)
                .and_then(|i| u64::try_from(i).ok());
            match int {
                Some(u) => visitor.visit_u64(u),
                None => Err(invalid_type(&event, &visitor)),
            }
        })
    }

    fn signed<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        self.with(
            |_, (event, _)| match plain(&event).and_then(parse_int).and_then(|i| i64::try_from(i).ok()) {
                Some(i) => visitor.visit_i64(i),
                None => Err(invalid_type(&event, &visitor)),
            },
        )
    }

    fn float<V: Visitor<'a>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        self.with(|_, (event, _)| {
            let float = plain(&event).and_then(|p| parse_int(p).map(|i| i as f64).or_else(|| parse_float(p)));
            match float {
                Some(f) => visitor.visit_f64(f),
                None => Err(invalid_type(&event, &visitor)),
            }
        })
    }
}

impl<'a> de::Deserializer<'a> for &mut Reader<'a> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|r, (event, _)| match event {
            Event::Scalar(text, ScalarStyle::Plain, ..) => {
                if is_null(&text) {
                    visitor.visit_unit()
                } else if let Some(b) = parse_bool(&text) {
                    visitor.visit_bool(b)
                } else if let Some(i) = parse_int(&text) {
                    match (u64::try_from(i), i64::try_from(i)) {
                        (Ok(u), _) => visitor.visit_u64(u),
                        (_, Ok(i)) => visitor.visit_i64(i),
                        _ => visitor.visit_f64(i as f64),
                    }
                } else if let Some(f) = parse_float(&text) {
                    visitor.visit_f64(f)
                } else {
                    visit_text(text, visitor)
                }
            }
            Event::Scalar(text, ..) => visit_text(text, visitor),
            Event::SequenceStart(..) => r.sequence(visitor),
            Event::MappingStart(..) => r.mapping(visitor),
            other => Err(invalid_type(&other, &visitor)),
        })
    }

    fn deserialize_bool<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|_, (event, _)| match plain(&event).and_then(parse_bool) {
            Some(b) => visitor.visit_bool(b),
            None => Err(invalid_type(&event, &visitor)),
        })
    }

    fn deserialize_i8<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.signed(visitor)
    }

    fn deserialize_i16<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.signed(visitor)
    }

    fn deserialize_i32<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.signed(visitor)
    }

    fn deserialize_i64<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.signed(visitor)
    }

    fn deserialize_u8<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.unsigned(visitor)
    }

    fn deserialize_u16<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.unsigned(visitor)
    }

    fn deserialize_u32<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.unsigned(visitor)
    }

    fn deserialize_u64<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.unsigned(visitor)
    }

    fn deserialize_f32<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.float(visitor)
    }

    fn deserialize_f64<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.float(visitor)
    }

    fn deserialize_char<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|_, (event, _)| match event {
            Event::Scalar(text, ..) => visit_text(text, visitor),
            other => Err(invalid_type(&other, &visitor)),
        })
    }

    fn deserialize_string<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'a>>(self, _visitor: V) -> Result<V::Value, Error> {
        self.with(|_, _| Err(de::Error::custom("bytes are not supported")))
    }

    fn deserialize_byte_buf<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(visitor)
    }

    fn deserialize_option<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        if plain(&self.peek()?.0).is_some_and(is_null) {
            self.next()?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|_, (event, _)| match plain(&event) {
            Some(p) if is_null(p) => visitor.visit_unit(),
            _ => Err(invalid_type(&event, &visitor)),
        })
    }

    fn deserialize_unit_struct<V: Visitor<'a>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'a>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|r, (event, _)| match event {
            Event::SequenceStart(..) => r.sequence(visitor),
            Event::Scalar(text, ScalarStyle::Plain, ..) if text.is_empty() => visitor.visit_seq(Seq {
                reader: r,
                index: 0,
                empty: true,
            }),
            other => Err(invalid_type(&other, &visitor)),
        })
    }

    fn deserialize_tuple<V: Visitor<'a>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|r, (event, _)| match event {
            Event::MappingStart(..) => r.mapping(visitor),
            Event::Scalar(text, ScalarStyle::Plain, ..) if text.is_empty() => {
                visitor.visit_map(Map { reader: r, empty: true })
            }
            other => Err(invalid_type(&other, &visitor)),
        })
    }

    fn deserialize_struct<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'a>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.with(|_, (event, _)| match event {
            Event::Scalar(text, ..) => visitor.visit_enum(de::value::StringDeserializer::new(text.into_owned())),
            other => Err(invalid_type(&other, &visitor)),
        })
    }

    fn deserialize_identifier<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'a>>(self, visitor: V) -> Result<V::Value, Error> {
        self.with(|r, (event, _)| {
            r.skip(&event)?;
            visitor.visit_unit()
        })
    }
}

struct Seq<'r, 'a> {
    reader: &'r mut Reader<'a>,
    index: usize,
    /// An empty plain scalar read as an empty sequence.
    empty: bool,
}

impl<'a> de::SeqAccess<'a> for Seq<'_, 'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'a>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        if self.empty || matches!(self.reader.peek()?.0, Event::SequenceEnd) {
            return Ok(None);
        }
        self.reader.path.push(Step::Index(self.index));
        self.index += 1;
        let value = seed.deserialize(&mut *self.reader);
        self.reader.path.pop();
        value.map(Some)
    }
}

struct Map<'r, 'a> {
    reader: &'r mut Reader<'a>,
    /// An empty plain scalar read as an empty mapping.
    empty: bool,
}

impl<'a> de::MapAccess<'a> for Map<'_, 'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'a>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        if self.empty {
            return Ok(None);
        }
        let step = match &self.reader.peek()?.0 {
            Event::MappingEnd => return Ok(None),
            Event::Scalar(text, ..) => Step::Key(text.clone()),
            _ => Step::Complex,
        };
        let key = seed.deserialize(&mut *self.reader)?;
        self.reader.path.push(step);
        Ok(Some(key))
    }

    fn next_value_seed<V: DeserializeSeed<'a>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = seed.deserialize(&mut *self.reader);
        self.reader.path.pop();
        value
    }
}
