//! A YAML reader for the configuration files: a serde [`Deserializer`](de::Deserializer) over the events of
//! `saphyr-parser`, taken one at a time, so a file is never held as a tree or as a list of events.
//!
//! Scalars resolve as YAML 1.2's core schema has them, as serde_yaml_ng (which read these files before) resolves
//! them: a plain scalar is an integer (`12`, `0x1f`, not `007`), a boolean (`true`, `True`, `TRUE`, and the same for
//! false) or null (`~`, `null`, empty) where the field wants one; a string field takes any scalar as written (`007`,
//! `true`); a quoted scalar is always a string. Anchored
//! subtrees are recorded as they are read and replayed where an alias names them. Errors carry the path inside the
//! document (`descriptors[3].rate_limit.unit`) and the line and column.
//!
//! This file reads the events (aliases expanded, the path inside the document kept); `scalar` resolves a scalar,
//! and `deserializer` is the serde side, which visits what a type asks for.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use saphyr_parser::{Event, Marker, Parser, ScanError, Span, StrInput};
use serde::de;

/// How deeply collections may nest before the reader refuses the document.
const MAX_DEPTH: usize = 128;

/// How many events aliases may replay beyond ten per event read: a bound on alias bombs.
const REPLAY_ALLOWANCE: usize = 100_000;

mod deserializer;
mod scalar;
#[cfg(test)]
mod tests;

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
