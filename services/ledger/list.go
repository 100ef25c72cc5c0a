package ledger

import "time"

// ListCursor is a position in a list of transfers or accounts, newest
// first: the (CreatedAt, ID) of the last one a page held. The next page
// holds those strictly before it, so a page is the same whatever was added
// after the first one was read.
type ListCursor struct {
	CreatedAt time.Time `json:"created_at"`
	ID        string    `json:"id"`
}

// TransferFilter selects a client's transfers for a list: each field set
// narrows it.
type TransferFilter struct {
	ClientID string
	// Account: transfers from or to it.
	Account string
	Status  Status
	// CreatedFrom and CreatedTo, when set, bound created_at:
	// [CreatedFrom, CreatedTo).
	CreatedFrom, CreatedTo *time.Time
	// Reference: the transfers with this reference (one, unless the
	// others were refused). Metadata: those whose metadata has every one
	// of these keys with its value.
	Reference string
	Metadata  map[string]string
	// After is the cursor of the page before (nil: the first page).
	After *ListCursor
}

// AccountFilter selects a client's accounts for a list.
type AccountFilter struct {
	ClientID string
	Currency string
	// Reference and Metadata narrow as TransferFilter's do.
	Reference string
	Metadata  map[string]string
	After     *ListCursor
}
