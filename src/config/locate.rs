//! Finding the line of a config key in the YAML text, so that a value that parses but is
//! invalid (an objective of 0.99, a duplicate SLO name) is reported with its line, as serde
//! reports a key it cannot parse. Block and flow styles, as people write config files.

/// The 1-based line holding `key` (`max_models`, `gpu.interval`, `slos[1].objective`,
/// `goodput.require[0]`), or the line of the nearest enclosing key or item found.
pub fn line_of(text: &str, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut range = 0..lines.len();
    let mut parent_indent: Option<usize> = None;
    let mut found = None;
    for segment in key.split('.') {
        let (name, index) = match segment.split_once('[') {
            Some((name, rest)) => (name, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (segment, None),
        };
        let Some(at) = range.clone().find(|&i| is_key_line(lines[i], name, parent_indent)) else {
            return found;
        };
        found = Some(at + 1);
        let indent = indentation(lines[at]);
        let end = block_end(&lines, at, indent);
        range = at..end;
        parent_indent = Some(indent);
        if let Some(index) = index {
            let items: Vec<usize> = (at + 1..end)
                .filter(|&i| lines[i].trim_start().starts_with('-'))
                .filter(|&i| Some(indentation(lines[i])) == (at + 1..end).find_map(|j| item_indent(lines[j])))
                .collect();
            let Some(&item) = items.get(index) else {
                return found; // a flow sequence, or fewer items: the key's own line
            };
            found = Some(item + 1);
            let item_end = items.iter().find(|&&i| i > item).copied().unwrap_or(end);
            range = item..item_end;
            parent_indent = Some(indentation(lines[item]));
        }
    }
    found
}

/// Whether `line` holds `name:` as a key, in block style (`name: v`, `- name: v`) or inside a
/// flow mapping (`{a: 1, name: v}`); at the top level only when `parent` is `None`.
fn is_key_line(line: &str, name: &str, parent: Option<usize>) -> bool {
    let content = line.trim_start();
    if content.starts_with('#') || (parent.is_none() && indentation(line) > 0) {
        return false;
    }
    let key = format!("{name}:");
    let body = content.trim_start_matches("- ");
    body.starts_with(&key)
        || [
            format!("{{{key}"),
            format!("{{ {key}"),
            format!(", {key}"),
            format!(",{key}"),
        ]
        .iter()
        .any(|p| body.contains(p.as_str()))
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn item_indent(line: &str) -> Option<usize> {
    line.trim_start().starts_with('-').then(|| indentation(line))
}

/// The line after the block that starts at `at` with `indent` ends.
fn block_end(lines: &[&str], at: usize, indent: usize) -> usize {
    (at + 1..lines.len())
        .find(|&i| {
            let content = lines[i].trim_start();
            !content.is_empty()
                && !content.starts_with('#')
                && (indentation(lines[i]) < indent || (indentation(lines[i]) == indent && !content.starts_with('-')))
        })
        .unwrap_or(lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "upstream: http://x:1\nmax_models: 3\ngpu:\n  interval: 1ms\nslos:\n  - name: a\n    objective: 99\n    ttft: 1s\n  - name: b\n    # a comment\n    objective: 0.99\n    tpot: 50ms\n  - {name: c, objective: 200, e2e: 1s}\ngoodput:\n  require: [a, zz]\n";

    #[test]
    fn keys_and_items_are_found_in_block_and_flow_style() {
        assert_eq!(line_of(FILE, "max_models"), Some(2));
        assert_eq!(line_of(FILE, "gpu.interval"), Some(4));
        assert_eq!(line_of(FILE, "slos[0].objective"), Some(7));
        assert_eq!(line_of(FILE, "slos[1].objective"), Some(11));
        assert_eq!(line_of(FILE, "slos[1].name"), Some(9));
        assert_eq!(line_of(FILE, "slos[2].objective"), Some(13));
        assert_eq!(line_of(FILE, "goodput.require[1]"), Some(15));
        assert_eq!(line_of(FILE, "listen"), None, "not in the file: a flag's value");
    }

    #[test]
    fn a_sequence_at_its_keys_indentation() {
        let text = "slos:\n- name: a\n  objective: 99\n- name: b\n  objective: 5\nmin_events: 3\n";
        assert_eq!(line_of(text, "slos[1].objective"), Some(5));
        assert_eq!(line_of(text, "min_events"), Some(6));
    }
}
