//! The server's `/metrics` page (Prometheus text format), parsed.

use anyhow::{anyhow, bail, ensure, Context, Result};
use std::collections::BTreeMap;

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    /// `# TYPE` lines: metric name to type.
    pub types: BTreeMap<String, String>,
}

impl Metrics {
    /// Parses the Prometheus text exposition format (0.0.4).
    pub fn parse(text: &str) -> Result<Self> {
        let mut m = Metrics::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest
                    .split_once(' ')
                    .ok_or_else(|| anyhow!("line {}: bad TYPE {line}", i + 1))?;
                m.types.insert(name.into(), ty.trim().into());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            m.samples.push(
                parse_sample(line).with_context(|| format!("metrics line {}: {line:?}", i + 1))?,
            );
        }
        Ok(m)
    }

    /// The sample with exactly these labels.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// Sum over samples whose labels include `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && filter
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Samples of one metric.
    pub fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

fn parse_sample(line: &str) -> Result<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => bail!("no value"),
    };
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let end;
        loop {
            // key
            let mut key = String::new();
            let mut c = chars.next();
            while let Some((_, ch)) = c {
                if ch == '=' || ch == '}' {
                    break;
                }
                if ch != ',' && !ch.is_whitespace() {
                    key.push(ch);
                }
                c = chars.next();
            }
            match c {
                Some((i, '}')) => {
                    end = i;
                    break;
                }
                Some((_, '=')) => {}
                _ => bail!("unterminated labels"),
            }
            ensure!(
                matches!(chars.next(), Some((_, '"'))),
                "label value must be quoted"
            );
            let mut val = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => val.push('\n'),
                        Some((_, c)) => val.push(c),
                        None => bail!("bad escape"),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => val.push(c),
                    None => bail!("unterminated label value"),
                }
            }
            labels.insert(key, val);
        }
        &body[end + 1..]
    } else {
        rest
    };
    let value_str = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("no value"))?;
    let value = match value_str {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().with_context(|| format!("bad value {v:?}"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}
