package apply_test

import (
	"github.com/vgpud/vgpud/pkg/apply"
	"github.com/vgpud/vgpud/pkg/manager"
)

var _ apply.Manager = (*manager.Manager)(nil)
