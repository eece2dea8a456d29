//! A YAML reader for the configuration files: a serde [`Deserializer`](de::Deserializer) over the events of
//! `saphyr-parser`, taken one at a time, so a file is never held as a tree or as a list of events.
//!
//! Scalars resolve as YAML 1.2's core schema has them, as serde_yaml_ng (which read these files before) resolves
//! them: a plain scalar is an integer (`12`, `0x1f`, not `007`), a boolean (`true`, `True`, `TRUE`, and the same for
//! false) or null (`~`, `null`, empty) where the field wants one; a string field takes any scalar as written (`007`,
//! `true`); a quoted scalar is always a string. Anchored
//! subtrees are recorded as they are read and replayed where an alias names them. Errors carry the path inside the
//! document (`descriptors[3].rate_limit.unit`) and the line and column.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use saphyr_parser::{Event, Marker, Parser, ScalarStyle, ScanError, Span, StrInput};
use serde::de::{self, DeserializeSeed, Expected, Unexpected, Visitor};

/// How deeply collections may nest before the reader refuses the document.
const MAX_DEPTH: usize = 128;

/// How many events aliases may replay beyond ten per event read: a bound on alias bombs.
const REPLAY_ALLOWANCE: usize = 100_000;

/// Reads the single document of `text`; `None` for a file with no document, or one that is only null.
pub(crate) fn from_str<'a, T: de::Deserialize<'a>>(text: &'a str) -> Result<Option<T>, Error> {
    let mut reader = Reader::new(text);
    let mut value = None;
    loop {
        let (event, span) = reader.next()?;
        match event {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => return Ok(value),
            Event::DocumentStart(_) if reader.documents > 0 => {
                return Err(Error::at(
                    "deserializing from YAML containing more than one document is not supported",
                    span.start,
                ));
            }
            Event::DocumentStart(_) => {
                reader.documents += 1;
                value = de::Deserialize::deserialize(&mut reader)?;
            }
            _ => return Err(Error::at("unexpected event outside a document", span.start)),
        }
    }
}

/// Why a document could not be read: the message, the path inside the document and where.
#[derive(Debug)]
pub(crate) struct Error {
    message: String,
    path: Option<String>,
    /// Line and column, both from 1.
    at: Option<(usize, usize)>,
}

impl Error {
    fn at(message: impl Into<String>, mark: Marker) -> Error {
        Error {
            message: message.into(),
            path: None,
            at: Some((mark.line(), mark.col() + 1)),
        }
    }
}

impl From<ScanError> for Error {
    fn from(e: ScanError) -> Error {
        Error::at(e.info(), *e.marker())
    }
}

impl de::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Error {
        Error {
            message: message.to_string(),
            path: None,
            at: None,
        }
    }
}

impl std::error::Error for Error {}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path.as_deref() {
            Some(path) if !path.is_empty() => write!(f, "{path}: {}", self.message)?,
            _ => f.write_str(&self.message)?,
        }
        // The very start of the text is no place worth naming.
        match self.at {
            Some((line, column)) if (line, column) != (1, 1) => write!(f, " at line {line} column {column}")?,
            _ => {}
        }
        Ok(())
    }
}

type Spanned<'a> = (Event<'a>, Span);

/// One step of the path inside the document.
enum Step<'a> {
    Index(usize),
    Key(Cow<'a, str>),
    /// A key that is not a scalar.
    Complex,
}

/// An anchored collection whose events are being recorded.
struct Recording<'a> {
    id: usize,
    events: Vec<Spanned<'a>>,
    /// Collections opened and not yet closed in the recording.
    open: usize,
}

struct Reader<'a> {
    parser: Parser<'a, StrInput<'a>>,
    peeked: Option<Spanned<'a>>,
    anchors: HashMap<usize, Rc<[Spanned<'a>]>>,
    recording: Vec<Recording<'a>>,
    /// Aliases being replayed, innermost last: the anchor's events and the next one to hand out.
    replaying: Vec<(Rc<[Spanned<'a>]>, usize)>,
    read: usize,
    replayed: usize,
    path: Vec<Step<'a>>,
    depth: usize,
    documents: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Reader<'a> {
        Reader {
            parser: Parser::new_from_str(text),
            peeked: None,
            anchors: HashMap::new(),
            recording: Vec::new(),
            replaying: Vec::new(),
            read: 0,
            replayed: 0,
            path: Vec::new(),
            depth: 0,
            documents: 0,
        }
    }

    fn next(&mut self) -> Result<Spanned<'a>, Error> {
        match self.peeked.take() {
            Some(event) => Ok(event),
            None => self.fetch(),
        }
    }

    fn peek(&mut self) -> Result<&Spanned<'a>, Error> {
        if self.peeked.is_none() {
            self.peeked = Some(self.fetch()?);
        }
        Ok(self.peeked.as_ref().expect("an event was just peeked"))
    }

    /// The next event, from the alias being replayed or from the text, with aliases expanded.
    fn fetch(&mut self) -> Result<Spanned<'a>, Error> {
        loop {
            let (event, fresh) = match self.replay_next() {
                Some(event) => {
                    self.replayed += 1;
                    if self.replayed > REPLAY_ALLOWANCE + 10 * self.read {
                        return Err(Error::at(
                            "repetition limit exceeded: aliases expand too far",
                            event.1.start,
                        ));
                    }
                    (event, false)
                }
                None => match self.parser.next_event() {
                    Some(event) => {
                        self.read += 1;
                        (event?, true)
                    }
                    None => return Err(de::Error::custom("unexpected end of the document")),
                },
            };
            if let Event::Alias(id) = event.0 {
                let Some(events) = self.anchors.get(&id) else {
                    return Err(Error::at(
                        "unknown anchor (an alias inside its own anchor?)",
                        event.1.start,
                    ));
                };
                self.replaying.push((Rc::clone(events), 0));
                continue;
            }
            self.record(&event, fresh);
            return Ok(event);
        }
    }

    fn replay_next(&mut self) -> Option<Spanned<'a>> {
        while let Some((events, next)) = self.replaying.last_mut() {
            if let Some(event) = events.get(*next) {
                *next += 1;
                return Some(event.clone());
            }
            self.replaying.pop();
        }
        None
    }

    /// Adds the event to every anchored collection being recorded, and starts recording at an anchor of the text.
    fn record(&mut self, event: &Spanned<'a>, fresh: bool) {
        for recording in &mut self.recording {
            recording.events.push(event.clone());
            match event.0 {
                Event::SequenceStart(..) | Event::MappingStart(..) => recording.open += 1,
                Event::SequenceEnd | Event::MappingEnd => recording.open -= 1,
                _ => {}
            }
        }
        while self.recording.last().is_some_and(|r| r.open == 0) {
            if let Some(done) = self.recording.pop() {
                self.anchors.insert(done.id, done.events.into());
            }
        }
        if !fresh {
            return;
        }
        match event.0 {
            Event::Scalar(_, _, id, _) if id != 0 => {
                self.anchors.insert(id, Rc::from([event.clone()]));
            }
            Event::SequenceStart(id, _) | Event::MappingStart(id, _) if id != 0 => {
                self.recording.push(Recording {
                    id,
                    events: vec![event.clone()],
                    open: 1,
                });
            }
            _ => {}
        }
    }

    /// The path inside the document, as `descriptors[3].rate_limit.unit`.
    fn path(&self) -> String {
        let mut path = String::new();
        for step in &self.path {
            let key = match step {
                Step::Index(i) => {
                    path.push_str(&format!("[{i}]"));
                    continue;
                }
                Step::Key(k) => k,
                Step::Complex => "?",
            };
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(key);
        }
        path
    }

    /// Gives an error that has no place yet this path and the event at `mark`.
    fn locate(&self, mut e: Error, mark: Marker) -> Error {
        if e.path.is_none() {
            e.path = Some(self.path());
        }
        if e.at.is_none() {
            e.at = Some((mark.line(), mark.col() + 1));
        }
        e
    }

    /// Takes the next event and hands it to `f`, placing any error at that event.
    fn with<T>(&mut self, f: impl FnOnce(&mut Self, Spanned<'a>) -> Result<T, Error>) -> Result<T, Error> {
        let event = self.next()?;
        let mark = event.1.start;
        f(self, event).map_err(|e| self.locate(e, mark))
    }

    fn enter(&mut self) -> Result<(), Error> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(de::Error::custom(format!(
                "recursion limit exceeded: collections nest deeper than {MAX_DEPTH}"
            )));
        }
        Ok(())
    }

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

    /// Skips the node whose first event was just taken.
    fn skip(&mut self, first: &Event<'a>) -> Result<(), Error> {
        let mut open = usize::from(matches!(first, Event::SequenceStart(..) | Event::MappingStart(..)));
        while open > 0 {
            match self.next()?.0 {
                Event::SequenceStart(..) | Event::MappingStart(..) => open += 1,
                Event::SequenceEnd | Event::MappingEnd => open -= 1,
                _ => {}
            }
        }
        Ok(())
    }
}

/// A plain scalar's text; `None` for quoted and block scalars and for collections.
fn plain<'e>(event: &'e Event<'_>) -> Option<&'e str> {
    match event {
        Event::Scalar(text, ScalarStyle::Plain, ..) => Some(text),
        _ => None,
    }
}

fn is_null(plain: &str) -> bool {
    matches!(plain, "" | "~" | "null" | "Null" | "NULL")
}

fn parse_bool(plain: &str) -> Option<bool> {
    match plain {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// An integer: decimal, `0x`, `0o` or `0b`, with an optional sign. Digits with a leading zero (`007`) are a string,
/// as in YAML 1.2.
fn parse_int(plain: &str) -> Option<i128> {
    let (negative, unsigned) = match plain.as_bytes().first() {
        Some(b'-') => (true, &plain[1..]),
        Some(b'+') => (false, &plain[1..]),
        _ => (false, plain),
    };
    if unsigned.starts_with(['+', '-']) {
        return None;
    }
    let (radix, digits) = if let Some(rest) = unsigned.strip_prefix("0x") {
        (16, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0o") {
        (8, rest)
    } else if let Some(rest) = unsigned.strip_prefix("0b") {
        (2, rest)
    } else if unsigned.len() > 1 && unsigned.starts_with('0') && unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    } else {
        (10, unsigned)
    };
    if digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i128::from_str_radix(digits, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

fn parse_float(plain: &str) -> Option<f64> {
    let unsigned = plain.strip_prefix('+').unwrap_or(plain);
    if unsigned.starts_with(['+', '-']) && unsigned.len() != plain.len() {
        return None;
    }
    match unsigned {
        ".inf" | ".Inf" | ".INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        _ => {}
    }
    let digits = unsigned.strip_prefix('-').unwrap_or(unsigned);
    if digits.len() > 1 && digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    unsigned.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// What an event holds, for "invalid type" errors: a plain scalar as what it resolves to.
fn unexpected<'e>(event: &'e Event<'_>) -> Unexpected<'e> {
    match event {
        Event::Scalar(text, style, ..) => {
            if *style != ScalarStyle::Plain {
                return Unexpected::Str(text);
            }
            if is_null(text) {
                Unexpected::Unit
            } else if let Some(b) = parse_bool(text) {
                Unexpected::Bool(b)
            } else if let Some(i) = parse_int(text) {
                match u64::try_from(i) {
                    Ok(u) => Unexpected::Unsigned(u),
                    Err(_) => i64::try_from(i).map_or(Unexpected::Str(text), Unexpected::Signed),
                }
            } else if let Some(f) = parse_float(text) {
                Unexpected::Float(f)
            } else {
                Unexpected::Str(text)
            }
        }
        Event::SequenceStart(..) => Unexpected::Seq,
        Event::MappingStart(..) => Unexpected::Map,
        _ => Unexpected::Other("the end of a collection"),
    }
}

fn invalid_type(event: &Event<'_>, expected: &dyn Expected) -> Error {
    de::Error::invalid_type(unexpected(event), expected)
}

fn visit_text<'a, V: Visitor<'a>>(text: Cow<'a, str>, visitor: V) -> Result<V::Value, Error> {
    match text {
        Cow::Borrowed(s) => visitor.visit_borrowed_str(s),
        Cow::Owned(s) => visitor.visit_string(s),
    }
}

impl<'a> Reader<'a> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RawDomain, parse};
    use std::path::Path;

    fn read(text: &str) -> Result<RawDomain, String> {
        match from_str::<RawDomain>(text) {
            Ok(Some(domain)) => Ok(domain),
            Ok(None) => Err("empty".to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What serde_yaml_ng, the loader this reader replaced, makes of the same text.
    fn reference(text: &str) -> Result<RawDomain, String> {
        match serde_yaml_ng::from_str::<Option<RawDomain>>(text) {
            Ok(Some(domain)) => Ok(domain),
            Ok(None) => Err("empty".to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn reads_as_the_previous_loader() {
        let documents = [
            "domain: d\n",
            "domain: d\ndescriptors:\n  - key: k\n    value: \"007\"\n  - key: k\n    value: 007\n  - key: k\n    value: true\n  - key: k\n    value: 1.5\n  - key: k\n    value: ~\n  - key: k\n    value: ''\n  - key: k\n    value: null\n  - key: k\n    value:\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0x10}\n  - key: l\n    rate_limit: {unit: Minute, requests_per_unit: +7, unlimited: False}\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 007}\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: '5'}\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -5}\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes\n",
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: 'true'\n",
            "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: TRUE\n    detailed_metric: True\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, colour: red}\n",
            "domain: d\ndescriptors:\n  - key: k\n    1: b\n",
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: a\n        metadata: {x: {2: y}}\n",
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {team: a, n: 3, f: 1.5, on: true, none: ~, list: [1, x, {y: z}], quoted: '3'}\n",
            "domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n",
            "domain: d\ndescriptors: {key: k}\n",
            "domain: [d]\n",
            "domain: 5\ndescriptors:\n",
            "domain: d\ndescriptors:\n  - key: k\n    descriptors: ~\n",
            "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\ndomain: d\nfailure_policy: fail_open\n",
            "domain: d\nquota_buckets:\n  - bucket: {a: b, c: ~}\n    rate_limit: {unit: second, requests_per_unit: 1}\n    assignment_ttl_seconds: 4\n",
            "domain: d\nquota_buckets:\n  - bucket: {a: [b]}\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, price: {a: 1, b: 2}, record: {key: u, size: 3}}\n",
            "---\ndomain: d\n...\n",
            "---\n",
            "",
            "# only a comment\n",
            "~\n",
            "[]\n",
            "5\n",
            "domain: d\n---\ndomain: e\n",
        ];
        for text in documents {
            let (ours, theirs) = (read(text), reference(text));
            match (&ours, &theirs) {
                (Ok(a), Ok(b)) => assert_eq!(format!("{a:?}"), format!("{b:?}"), "{text:?}"),
                // The same message, at times with a place where the previous loader gave none.
                (Err(a), Err(b)) => assert!(a == b || a.starts_with(&format!("{b} at line")), "{text:?}: {a} / {b}"),
                _ => panic!("{text:?}: {ours:?} but before {theirs:?}"),
            }
        }
    }

    #[test]
    fn quoted_and_plain_scalars() {
        let d = read("domain: d\ndescriptors:\n  - key: k\n    value: \"007\"\n  - key: k\n    value: 007\n  - key: k\n    value: true\n  - key: k\n    value: 'null'\n  - key: k\n    value: null\n").unwrap();
        let values: Vec<_> = d.descriptors.iter().map(|d| d.value.as_deref()).collect();
        assert_eq!(values, [Some("007"), Some("007"), Some("true"), Some("null"), None]);
        let e = read("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n")
            .unwrap_err();
        assert_eq!(
            e,
            "descriptors[0].rate_limit.requests_per_unit: invalid type: string \"5\", expected u32 at line 4 column 51"
        );
        let e = read("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: \"true\"\n").unwrap_err();
        assert!(
            e.starts_with("descriptors[0].shadow_mode: invalid type: string \"true\", expected a boolean"),
            "{e}"
        );
    }

    #[test]
    fn anchors_and_aliases() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    value: &v one\n    rate_limit: &minute {unit: minute, requests_per_unit: &n 5}\n  - key: k\n    value: two\n    rate_limit: *minute\n  - key: *v\n    rate_limit: {unit: second, requests_per_unit: *n}\n    descriptors: &children\n      - key: a\n        rate_limit: *minute\n  - key: l\n    descriptors: *children\n";
        let d = read(text).unwrap();
        assert_eq!(format!("{d:?}"), format!("{:?}", reference(text).unwrap()));
        let limit = |i: usize| {
            d.descriptors[i]
                .rate_limit
                .as_deref()
                .map(|r| (r.unit.clone(), r.requests_per_unit))
        };
        assert_eq!(limit(0), limit(1));
        assert_eq!(&*d.descriptors[2].key, "one");
        assert_eq!(d.descriptors[2].rate_limit.as_ref().unwrap().requests_per_unit, 5);
        assert_eq!(&*d.descriptors[3].descriptors[0].key, "a");
        assert_eq!(
            limit(0),
            d.descriptors[3].descriptors[0]
                .rate_limit
                .as_deref()
                .map(|r| (r.unit.clone(), 5))
        );
        // An anchor redefined later names the later node from there on.
        let d = read("domain: d\ndescriptors:\n  - {key: &k a}\n  - {key: *k, value: x}\n  - {key: &k b}\n  - {key: *k, value: y}\n").unwrap();
        let keys: Vec<_> = d.descriptors.iter().map(|d| &*d.key).collect();
        assert_eq!(keys, ["a", "a", "b", "b"]);
        // An alias inside its own anchor, or to no anchor, is refused.
        let e = read("domain: d\ndescriptors: &l\n  - key: k\n    descriptors: *l\n").unwrap_err();
        assert!(e.contains("anchor"), "{e}");
        let e = read("domain: d\ndescriptors: *nothing\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let e = from_str::<serde_json::Value>(&text).unwrap_err().to_string();
        assert!(e.contains("repetition limit exceeded"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        for text in ["[".repeat(100_000), "{a: ".repeat(100_000), "- ".repeat(10_000)] {
            let e = read(&text).unwrap_err();
            assert!(!e.is_empty());
        }
        let text = format!(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {{a: {}1{}}}\n",
            "[".repeat(200),
            "]".repeat(200)
        );
        let e = read(&text).unwrap_err();
        assert!(e.contains("recursion limit exceeded"), "{e}");
        assert!(e.starts_with("descriptors[0].metadata.a"), "{e}");
    }

    #[test]
    fn an_error_deep_in_a_large_file_names_its_path_and_line() {
        let mut text = String::from("domain: big\ndescriptors:\n");
        for i in 0..20_000 {
            let unit = if i == 17_345 { "fortnight: 1" } else { "unit: minute" };
            text.push_str(&format!(
                "  - key: tenant\n    value: t{i}\n    rate_limit:\n      {unit}\n      requests_per_unit: 10\n"
            ));
        }
        let e = parse(Path::new("big.yaml"), &text).unwrap_err().to_string();
        let line = 2 + 17_345 * 5 + 4;
        assert!(
            e.starts_with(
                "config 'big.yaml': descriptors[17345].rate_limit: unknown field `fortnight`, expected one of"
            ),
            "{e}"
        );
        assert!(e.ends_with(&format!("at line {line} column 7")), "{e}");
        assert_eq!(e, format!("config 'big.yaml': {}", reference(&text).unwrap_err()));
    }

    #[test]
    fn metadata_keys_are_strings() {
        let e = read("domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [{true: 1}]}\n").unwrap_err();
        assert!(
            e.starts_with("descriptors[0].metadata.a[0]: key is not a string: true at line 4"),
            "{e}"
        );
        let e = read("domain: d\ndescriptors:\n  - key: k\n    metadata: {? [a] : 1}\n").unwrap_err();
        assert!(
            e.starts_with("descriptors[0].metadata: key is not a string: a sequence"),
            "{e}"
        );
        let d = read("domain: d\ndescriptors:\n  - key: k\n    metadata: {'1': one, \"true\": yes}\n").unwrap();
        let m = d.descriptors[0].metadata.as_deref().unwrap();
        assert_eq!(m["1"], "one");
        assert_eq!(m["true"], "yes");
    }

    #[test]
    fn empty_files_and_documents() {
        for text in ["", "\n\n", "# comment\n", "---\n", "~\n", "null\n", "--- ~\n...\n"] {
            assert!(matches!(from_str::<RawDomain>(text), Ok(None)), "{text:?}");
        }
        let e = read("domain: d\n---\ndomain: e\n").unwrap_err();
        assert!(e.contains("more than one document"), "{e}");
        let e = read("domain: d\ndescriptors:\n  - key: k\n    key: l\n").unwrap_err();
        assert_eq!(e, "descriptors[0].key: duplicate field `key` at line 3 column 5");
    }
}
