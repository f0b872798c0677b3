"""Markdown of a plan comment to an HTML page that looks like a GitHub pull-request comment:
cmark-gfm (GitHub's renderer) with GitHub's extensions, and GitHub's comment styling, written
here (system fonts, 14px text, bordered tables, grey code blocks, the comment box and header)."""

import html
import sys

import cmarkgfm
from cmarkgfm.cmark import Options

source, target = sys.argv[1], sys.argv[2]
with open(source) as f:
    markdown = f.read()
body = cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)

STYLE = """
body { margin: 0; background: #fff; font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", "Noto Sans",
  Helvetica, Arial, sans-serif; font-size: 14px; line-height: 1.5; color: #1f2328; }
.timeline { padding: 16px 24px 24px 24px; }
.comment { border: 1px solid #d1d9e0; border-radius: 6px; max-width: 940px; }
.header { background: #f6f8fa; border-bottom: 1px solid #d1d9e0; padding: 8px 16px; color: #59636e;
  border-radius: 6px 6px 0 0; }
.header b { color: #1f2328; }
.markdown-body { padding: 16px; }
.markdown-body > *:first-child { margin-top: 0 !important; }
h3 { font-size: 1.25em; font-weight: 600; margin: 24px 0 16px; line-height: 1.25; }
p, ul, ol, table, pre, details, blockquote { margin: 0 0 16px; }
ul, ol { padding-left: 2em; }
table { border-collapse: collapse; display: block; width: max-content; max-width: 100%; overflow: auto; }
th, td { border: 1px solid #d1d9e0; padding: 6px 13px; }
th { font-weight: 600; }
tr:nth-child(2n) { background: #f6f8fa; }
code { font-family: ui-monospace, SFMono-Regular, "SF Mono", Menlo, Consolas, "Liberation Mono", monospace;
  font-size: 85%; background: rgba(129,139,152,0.12); border-radius: 6px; padding: .2em .4em; }
pre { background: #f6f8fa; border-radius: 6px; padding: 16px; overflow: auto; font-size: 85%; line-height: 1.45; }
pre code { background: transparent; padding: 0; font-size: 100%; }
summary { cursor: pointer; }
sub { color: #59636e; }
blockquote { color: #59636e; border-left: .25em solid #d1d9e0; padding: 0 1em; }
"""

page = """<!doctype html>
<html><head><meta charset="utf-8"><title>tidemark plan</title><style>%s</style></head>
<body><div class="timeline"><div class="comment">
<div class="header"><b>github-actions</b> bot commented · edited</div>
<div class="markdown-body">
%s
</div></div></div></body></html>
""" % (STYLE, body)
with open(target, "w") as f:
    f.write(page)
print("rendered %s (%d bytes of markdown)" % (html.escape(source), len(markdown)))
