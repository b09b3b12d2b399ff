"""The console's HTML builder: values are escaped by construction, bytes shown safely."""

from __future__ import annotations

from dmq.client.cli.console._html import SHOW_BYTES_MAX, Html, badge, esc, show_bytes, tag, url


def test_children_and_attributes_are_escaped_unless_already_html():
    built = tag("a", "<b>&", tag("i", "x"), href='"><script>', class_="k", data_group="G_<t>", hidden=True,
                title=None)
    assert built == ('<a href="&quot;&gt;&lt;script&gt;" class="k" data-group="G_&lt;t&gt;" hidden>'
                     "&lt;b&gt;&amp;<i>x</i></a>")
    assert esc(Html("<ok>")) == "<ok>" and esc("<no>") == "&lt;no&gt;" and esc(None) == ""


def test_bytes_are_text_when_utf8_else_hex_and_cut_at_the_limit():
    assert show_bytes("é<".encode()) == '<span class="value">é&lt;</span>'
    assert show_bytes(b"\xff<") == '<code class="hex">hex:ff3c</code>'
    assert show_bytes(None) == '<span class="muted">null</span>'
    long = "é".encode() * SHOW_BYTES_MAX  # the cut falls inside a two-byte character
    shown = show_bytes(long)
    assert shown.startswith('<span class="value">é') and f"({len(long)} bytes)" in shown and "hex:" not in shown


def test_path_segments_are_percent_encoded_and_modes_have_badges():
    assert url("/topics", "a/b?c", "messages", limit=5, time="") == "/topics/a%2Fb%3Fc/messages?limit=5"
    assert badge("new") == '<span class="badge badge-new" data-mode="new">NEW</span>'
    assert 'class="badge badge-default"' in badge("<odd>") and "&lt;ODD&gt;" in badge("<odd>")
