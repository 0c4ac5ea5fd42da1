//! Self-contained HTML pages of what keyorder judged and planned: the delivery timeline of a
//! history ([`timeline`]) and the charts of a repartition plan ([`plan_page`]). Pure string
//! building; every page carries its own CSS and script and fetches nothing.

pub mod plan_page;
pub mod timeline;

/// Text made safe for HTML element content and attribute values (`&`, `<`, `>`, `"`, `'`);
/// everything else, non-ASCII included, is kept (the pages are UTF-8).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
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
    use super::escape;

    #[test]
    fn escape_covers_markup_and_keeps_other_text() {
        assert_eq!(escape(r#"<a href="x">&'é"#), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;é");
    }
}
