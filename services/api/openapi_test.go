package api_test

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/paymesh/paymesh/services/api"
)

// TestOpenAPIMatchesHandlers: every route and error code in the OpenAPI
// document exists in the server, and the reverse.
func TestOpenAPIMatchesHandlers(t *testing.T) {
	var doc struct {
		Paths      map[string]map[string]any `yaml:"paths"`
		Components struct {
			Schemas struct {
				Problem struct {
					Properties struct {
						Code struct {
							Enum []string `yaml:"enum"`
						} `yaml:"code"`
					} `yaml:"properties"`
				} `yaml:"Problem"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var inDoc []string
	for path, ops := range doc.Paths {
		for method := range ops {
			inDoc = append(inDoc, strings.ToUpper(method)+" "+path)
		}
	}
	served := api.New(api.Config{}).Routes()
	sort.Strings(inDoc)
	sort.Strings(served)
	if !slices.Equal(inDoc, served) {
		t.Errorf("routes differ:\n document: %v\n served:   %v", inDoc, served)
	}
	var codes []string
	for _, c := range api.Codes() {
		codes = append(codes, string(c))
	}
	documented := doc.Components.Schemas.Problem.Properties.Code.Enum
	sort.Strings(codes)
	sort.Strings(documented)
	if !slices.Equal(codes, documented) {
		t.Errorf("error codes differ:\n document: %v\n handlers: %v", documented, codes)
	}
}
