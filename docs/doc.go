// Package docs holds the project's documentation pages (Markdown, linked
// from the README) and the test that keeps them true: it fails on a
// dangling link, anchor or quoted path, on a Go comment that names a file
// the repository does not hold, and on a README longer than a new user
// reads. It holds no code, and nothing imports it.
package docs
