"""Layer 0, below everything: process set-up, the model hub, file integrity, language codes, the
package's own resource files and the run log. Nothing here knows about training."""
