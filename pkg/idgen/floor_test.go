package idgen

import (
	"errors"
	"testing"
	"time"
)

// TestSameNodeRepeatsIDs shows why a machine id needs an owner: two
// Generators with the same (region, node), as two processes started with
// the same --node, mint the same ID when they mint in the same 10 ms tick.
func TestSameNodeRepeatsIDs(t *testing.T) {
	r := testRegions(t)
	for range 200 {
		a, err := NewGenerator(r, "eu", 7)
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewGenerator(r, "eu", 7)
		if err != nil {
			t.Fatal(err)
		}
		x, _ := a.Next()
		y, _ := b.Next()
		if x == y {
			return // the collision the node lease prevents
		}
	}
	t.Fatal("200 pairs of same-node Generators never minted the same first ID; want a collision")
}

func TestFloor(t *testing.T) {
	r := testRegions(t)
	t.Run("ErrClockBehind", func(t *testing.T) {
		g, err := NewGeneratorWith(r, "eu", 1, GeneratorConfig{Floor: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if id, err := g.Next(); !errors.Is(err, ErrClockBehind) {
			t.Fatalf("Next with the floor an hour ahead = %v, %v; want ErrClockBehind", id, err)
		}
		if hw := g.HighWater(); !hw.IsZero() {
			t.Fatalf("HighWater after a refused Next = %v, want zero", hw)
		}
	})
	t.Run("OK", func(t *testing.T) {
		floor := time.Now().Add(-time.Second)
		g, err := NewGeneratorWith(r, "eu", 1, GeneratorConfig{Floor: floor})
		if err != nil {
			t.Fatal(err)
		}
		id, err := g.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !id.Time().After(floor) {
			t.Fatalf("id time %v not after floor %v", id.Time(), floor)
		}
		if hw := g.HighWater(); !hw.Equal(id.Time()) {
			t.Fatalf("HighWater = %v, want the ID's time %v", hw, id.Time())
		}
	})
}

func TestPermit(t *testing.T) {
	r := testRegions(t)
	lost := errors.New("lease lost")
	var err error
	g, e := NewGeneratorWith(r, "eu", 1, GeneratorConfig{Permit: func() error { return err }})
	if e != nil {
		t.Fatal(e)
	}
	if _, e := g.Next(); e != nil {
		t.Fatalf("Next while permitted: %v", e)
	}
	err = lost
	if id, e := g.Next(); !errors.Is(e, lost) || id != 0 {
		t.Fatalf("Next after the permit is withdrawn = %v, %v; want 0 and the permit's error", id, e)
	}
}
