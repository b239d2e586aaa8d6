package rewrite
