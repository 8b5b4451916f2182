//! Reads the text format back into samples: what `braid stats` and `braid top` do
//! with the answers of every server.

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    pub line: usize,
    pub why: &'static str,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.why)
    }
}

impl std::error::Error for ParseError {}

/// Every sample of `text`; comments and blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|why| ParseError { line: i + 1, why })?);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        rest = r;
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(r) = rest.strip_prefix('}') {
                rest = r;
                break;
            }
            let eq = rest.find('=').ok_or("label without '='")?;
            let label = rest[..eq].trim().to_string();
            rest = rest[eq + 1..].strip_prefix('"').ok_or("label value without quotes")?;
            let mut value = String::new();
            let mut chars = rest.char_indices();
            let end = loop {
                match chars.next() {
                    None => return Err("unterminated label value"),
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => return Err("unterminated escape"),
                    },
                    Some((_, c)) => value.push(c),
                }
            };
            labels.push((label, value));
            rest = &rest[end + 1..];
        }
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| "value is not a number")?,
    };
    Ok(Sample { name: name.to_string(), labels, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Counter, Family, Histogram, Labels, Render};

    #[derive(Clone, PartialEq, Eq, Hash)]
    struct Job(String);
    impl Labels for Job {
        fn each(&self, label: &mut dyn FnMut(&'static str, &str)) {
            label("job", &self.0);
        }
    }

    #[test]
    fn what_is_rendered_parses_back() {
        let c: Family<Job, Counter> = Family::new("braid_x_total", "X.");
        c.with(&Job("we\"ird,\\job}\n".into()), |c| c.add(5));
        let h: Family<Job, Histogram> = Family::with_buckets("braid_x_seconds", "X.", &[0.5]);
        h.with(&Job("j".into()), |h| h.observe(0.25));
        let mut text = String::new();
        c.render(&mut text);
        h.render(&mut text);
        let samples = parse(&text).unwrap();
        assert_eq!(samples[0].label("job"), Some("we\"ird,\\job}\n"));
        assert_eq!(samples[0].value, 5.0);
        let inf = samples.iter().find(|s| s.label("le") == Some("+Inf")).unwrap();
        assert_eq!((inf.name.as_str(), inf.value), ("braid_x_seconds_bucket", 1.0));
    }

    #[test]
    fn broken_lines_are_refused_with_their_number() {
        for bad in ["x{a=\"1} 2", "x{a=1} 2", "x 1\ny{", "{a=\"b\"} 1", "x notanumber"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(parse("a 1\nb{").unwrap_err().line, 2);
    }
}
