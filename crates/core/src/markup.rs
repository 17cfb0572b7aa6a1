//! Escaping for markup: the one way text that is not ours goes into HTML or an XML-like envelope.

/// `chars` with the five markup characters (`& < > " '`) escaped as entities: safe in HTML text and in attribute
/// values, and in the tool-output envelope.
#[must_use]
pub fn escape_markup(chars: impl Iterator<Item = char>) -> String {
    // At least one byte a char: a `Chars` (filtered or not) bounds its count by its bytes.
    let (low, high) = chars.size_hint();
    let mut out = String::with_capacity(high.unwrap_or(low));
    for c in chars {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_five_markup_characters_become_entities() {
        assert_eq!(super::escape_markup("a<b>&\"c'".chars()), "a&lt;b&gt;&amp;&quot;c&#39;");
        assert_eq!(super::escape_markup("plain ünïcode".chars()), "plain ünïcode");
    }
}
